"""Requests an outside client can shape against the router: KV held for nothing, borrowed ids,
bodies no engine should see, answers that must come once and whole (issue 13, items 3-5)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, MiniEngine, Router, call, free_port, journal_rows
from tests.component.serve.test_hostile_clients import _read_reply

pytestmark = pytest.mark.timeout(120)
CONTEXT = 64


def _pd(spawn: Spawner, *, decode_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
        **sections: Any) -> tuple[MiniEngine, MiniEngine, Router]:
    p = spawn.engine("p0", "--max-model-len", str(CONTEXT))
    d = spawn.engine("d0", "--max-model-len", str(CONTEXT), *decode_args)
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")], env=env, **sections)
    return p, d, r


def _completion_legs(engine: MiniEngine) -> list[dict[str, Any]]:
    return [c for c in engine.calls() if c["path"] == "/v1/completions"]


# -- 3. KV reserved for a request the decode engine refuses ------------------------------

def test_a_request_over_the_context_is_refused_before_any_leg(spawn: Spawner) -> None:
    p, d, r = _pd(spawn)
    reply = call(r.port, "POST", "/v1/completions",
                 {"model": MODEL, "prompt": [5] * 60, "max_tokens": 10})
    assert reply.status == 400
    err = reply.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "60 in the prompt, 10 in the completion" in err["message"]  # the client's numbers
    assert p.calls() == [] and d.calls() == []  # no prefill leg reserved any KV


def test_max_tokens_alone_over_the_context_is_refused_without_counting(spawn: Spawner) -> None:
    p, d, r = _pd(spawn)
    reply = call(r.port, "POST", "/v1/completions",
                 {"model": MODEL, "prompt": "a b c", "max_tokens": 500})
    assert reply.status == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
    assert "500 in the completion" in reply.json()["error"]["message"]
    assert p.calls() == [] and d.calls() == []


def test_a_text_prompt_near_the_context_is_counted_first_and_never_prefilled(
        spawn: Spawner) -> None:
    p, _, r = _pd(spawn)
    reply = call(r.port, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "w " * 50}], "max_tokens": 20})
    assert reply.status == 400
    assert "53 in the messages, 20 in the completion" in reply.json()["error"]["message"]
    assert [c["path"] for c in p.calls()] == ["/tokenize"]


def test_a_refused_decode_leg_hands_the_producers_kv_to_a_release_leg(spawn: Spawner) -> None:
    p, d, r = _pd(spawn, decode_args=("--decode-status", "400"))
    reply = call(r.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 4,
                                                     "min_tokens": 2})
    assert reply.status == 400
    (prefill,) = _completion_legs(p)
    deadline = time.monotonic() + 5
    while len(_completion_legs(d)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    decode, release = _completion_legs(d)
    assert release["x_request_id"] == decode["x_request_id"] + "-release"
    assert release["body"]["kv_transfer_params"] == prefill["produced"]
    assert release["body"]["max_tokens"] == 1 and release["body"]["stream"] is False
    metrics = call(r.port, "GET", "/metrics").body.decode()
    assert 'narwhal_router_kv_releases_total{outcome="sent"} 1.0' in metrics


def test_a_prompt_the_estimate_missed_is_caught_after_prefill_and_its_kv_released(
        spawn: Spawner) -> None:
    """Teach the estimator long tokens, then send short ones: the prefill leg runs, its usage
    shows the request cannot fit, and the KV goes to a release leg instead of a refused one."""
    p, d, r = _pd(spawn)
    word = "x" * 40
    for _ in range(80):
        assert call(r.port, "POST", "/v1/completions",
                    {"model": MODEL, "prompt": f"{word} {word}", "max_tokens": 2}).status == 200
    reply = call(r.port, "POST", "/v1/completions",
                 {"model": MODEL, "prompt": "a " * 60, "max_tokens": 10})
    assert reply.status == 400
    assert "60 in the prompt, 10 in the completion" in reply.json()["error"]["message"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        legs = _completion_legs(d)
        if legs and legs[-1]["x_request_id"].endswith("-release"):
            break
        time.sleep(0.05)
    last_prefill = _completion_legs(p)[-1]
    release = _completion_legs(d)[-1]
    assert release["x_request_id"].endswith("-release")
    assert release["body"]["kv_transfer_params"] == last_prefill["produced"]


# -- 4. engine legs carry ids only the router makes --------------------------------------

def test_a_client_cannot_claim_the_id_of_another_request(spawn: Spawner) -> None:
    """A claims the id the router will give next: refused, the `nw-` form is the router's own.
    B (no id) follows; C and D repeat one id of their own. Every leg still has its own
    router-made id, so no two requests share a KV handoff key, and the journal's ids say who
    made them."""
    p, d, r = _pd(spawn)
    first = call(r.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2})
    prefix, _, seq = first.headers["x-request-id"].rpartition("-")
    guess = f"{prefix}-{int(seq, 16) + 1:x}"  # the id the router would give the next request
    claimed = call(r.port, "POST", "/v1/completions",
                   {"model": MODEL, "prompt": "b", "max_tokens": 2}, {"x-request-id": guess})
    assert claimed.status == 400
    assert claimed.json()["error"]["code"] == "invalid_request_id"
    assert "'nw-'" in claimed.json()["error"]["message"]
    replies = [
        call(r.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "c", "max_tokens": 2}),
        call(r.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "d", "max_tokens": 2},
             {"x-request-id": "mine-1"}),
        call(r.port, "POST", "/v1/completions", {"model": MODEL, "prompt": "e", "max_tokens": 2},
             {"x-request-id": "mine-1"}),
    ]
    assert [x.status for x in replies] == [200, 200, 200]
    assert replies[1].headers["x-request-id"] == replies[2].headers["x-request-id"] == "mine-1"
    rows = [row for row in journal_rows(spawn.journal, 4) if row["status"] == 200]
    assert [row["request_id"] for row in rows][2:] == ["mine-1", "mine-1"]
    engine_ids = [row["engine_request_id"] for row in rows]
    assert len(set(engine_ids)) == 4
    assert all(e.startswith("nw-") for e in engine_ids)
    prefill_ids = [c["x_request_id"] for c in _completion_legs(p)]
    decode_ids = [c["x_request_id"] for c in _completion_legs(d)]
    assert prefill_ids == [f"{e}-prefill" for e in engine_ids]
    assert decode_ids == engine_ids  # one decode leg per request, none shared


# -- 5. smaller ones ---------------------------------------------------------------------

def test_tokenize_and_detokenize_are_routed_to_an_engine(spawn: Spawner) -> None:
    _, _, r = _pd(spawn)
    tok = call(r.port, "POST", "/tokenize", {"model": MODEL, "prompt": "one two three"})
    assert tok.status == 200 and tok.json()["count"] == 3
    detok = call(r.port, "POST", "/detokenize", {"model": MODEL, "tokens": [1, 2]})
    assert detok.status == 200 and detok.json()["prompt"] == "t1 t2"
    wrong = call(r.port, "POST", "/tokenize", {"model": "other", "prompt": "x"})
    assert wrong.status == 404


@pytest.mark.parametrize("raw", [
    b'{"model":"mini-model","prompt":"\\ud800","max_tokens":2}',
    b'{"model":"mini-model","prompt":"a","max_tokens":2,"x":' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"model":"mini-model","prompt":"a","max_tokens":2,"x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"model":"mini-model","prompt":"a","max_tokens":2,"x":' + b"[" * 128 + b"]" * 128 + b"}",
    b'{"model":"mini-model","prompt":"a","max_tokens":2,"x":' + b'{"k":' * 300 + b"1"
    + b"}" * 300 + b"}",
], ids=["lone-surrogate", "nested-5000", "nested-1000", "nested-129", "objects-301"])
def test_json_no_engine_could_read_back_is_a_400_not_a_callback_error(
        spawn: Spawner, raw: bytes) -> None:
    """Nesting orjson parses but the legs could not be encoded again (deeper than 128: the
    1000-level case was a 500 with a traceback per request) is refused like bad JSON."""
    p, d, r = _pd(spawn)
    reply = call(r.port, "POST", "/v1/completions", raw=raw)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "invalid_json"
    assert p.calls() == [] and d.calls() == []
    assert call(r.port, "GET", "/health").status == 200
    r.stop()
    assert "Traceback" not in r.stderr and "this is a bug" not in r.stderr


def test_nesting_to_the_limit_and_brackets_inside_strings_are_served(spawn: Spawner) -> None:
    """127 levels under the body (128 with it) reach the engine; brackets in a string are text."""
    _, d, r = _pd(spawn)
    deep = (b'{"model":"mini-model","prompt":"a","max_tokens":2,"x":' + b"[" * 127 + b"]" * 127
            + b"}")
    text = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 2,
                       "user": "[" * 3000 + "{" * 3000}).encode()
    assert call(r.port, "POST", "/v1/completions", raw=deep).status == 200
    assert call(r.port, "POST", "/v1/completions", raw=text).status == 200
    assert len(_completion_legs(d)) == 2


def test_a_body_after_a_utf8_byte_order_mark_is_read_as_vllm_reads_it(spawn: Spawner) -> None:
    _, d, r = _pd(spawn)
    raw = b"\xef\xbb\xbf" + json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 2}).encode()
    reply = call(r.port, "POST", "/v1/completions", raw=raw)
    assert reply.status == 200, reply.body[:300]
    assert len(_completion_legs(d)) == 1


@pytest.mark.parametrize("n", ["1.0", "true", "2", "\"1\""])
def test_n_must_be_the_integer_1(spawn: Spawner, n: str) -> None:
    p, d, r = _pd(spawn)
    raw = b'{"model":"mini-model","prompt":"a","max_tokens":2,"n":%b}' % n.encode()
    reply = call(r.port, "POST", "/v1/completions", raw=raw)
    assert reply.status == 400 and reply.json()["error"]["param"] == "n"
    assert p.calls() == [] and d.calls() == []


@pytest.mark.parametrize("literal", [b"18446744073709551616", b"-9223372036854775809",
                                     b"1" + b"0" * 30])
def test_integers_beyond_64_bits_are_refused_not_forwarded_as_floats(
        spawn: Spawner, literal: bytes) -> None:
    p, d, r = _pd(spawn)
    raw = b'{"model":"mini-model","prompt":"a","max_tokens":2,"seed":%b}' % literal
    reply = call(r.port, "POST", "/v1/completions", raw=raw)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "seed"
    assert p.calls() == [] and d.calls() == []


def test_a_websocket_upgrade_gets_exactly_one_response(spawn: Spawner) -> None:
    _, _, r = _pd(spawn)
    with socket.create_connection(("127.0.0.1", r.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: r\r\nupgrade: websocket\r\nconnection: Upgrade"
                  b"\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  b"sec-websocket-version: 13\r\n\r\n")
        reply = _read_reply(s)
    assert reply.count(b"HTTP/1.1 ") == 1, reply
    assert reply.startswith(b"HTTP/1.1 400 ")


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
            b"%bcontent-length: %d\r\n\r\n%b" % (extra, len(body), body))


def _statuses(reply: bytes) -> list[int]:
    return [int(reply[i + 9:i + 12]) for i in range(len(reply))
            if reply.startswith(b"HTTP/1.1 ", i)]


@pytest.mark.parametrize("refused,status", [
    (b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-length: 9000000\r\n\r\n", 413),
    (b"GET /" + b"x" * 5000 + b" HTTP/1.1\r\nhost: r\r\n\r\n", 414),
    (b"GET /health HTTP/1.1\r\nhost: r\r\nx-big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    (b"GET /health HTTP/1.1\r\nhost r\r\n\r\n", 400),
], ids=["413", "414", "431", "400"])
def test_pipelined_requests_before_a_refused_one_are_all_answered_in_order(
        spawn: Spawner, refused: bytes, status: int) -> None:
    """c1, c2, c3, then a request the parser refuses: c1..c3 each run and are answered and
    journaled in order, then the refusal, then the close (c2 and c3 were dropped)."""
    _, d, r = _pd(spawn, serving={"max_request_bytes": 2048, "max_request_line_bytes": 2048,
                                  "max_header_bytes": 4096})
    bodies = [json.dumps({"model": MODEL, "prompt": f"c{k}", "max_tokens": 2}).encode()
              for k in (1, 2, 3)]
    with socket.create_connection(("127.0.0.1", r.port)) as s:
        s.sendall(b"".join(_post(b, b"x-request-id: c%d\r\n" % k)
                           for k, b in enumerate(bodies, 1)) + refused)
        reply = _read_reply(s)
    assert _statuses(reply) == [200, 200, 200, status], reply[-400:]
    tail = reply[reply.rindex(b"HTTP/1.1 "):]
    assert b'"type":"invalid_request_error"' in tail
    rows = journal_rows(spawn.journal, 3)
    assert [row["request_id"] for row in rows] == ["c1", "c2", "c3"]
    assert [row["status"] for row in rows] == [200, 200, 200]
    assert [c["body"]["prompt"] for c in _completion_legs(d)] == ["c1", "c2", "c3"]


def test_operational_pages_need_the_operator_key_when_tenants_have_keys(spawn: Spawner) -> None:
    keys = {"NW_T_KEY": "tenant-key-0123456789abcdef", "NW_OPS_KEY": "ops-key-0123456789abcdef"}
    _, _, r = _pd(spawn, env=keys, tenants=[{"name": "a", "key_env": "NW_T_KEY"}],
                  operations={"key_env": "NW_OPS_KEY"})
    tenant = {"authorization": f"Bearer {keys['NW_T_KEY']}"}
    ops = {"authorization": f"Bearer {keys['NW_OPS_KEY']}"}
    for path in ("/metrics", "/narwhal/state", "/narwhal/handoff"):
        assert call(r.port, "GET", path).status == 401, path
        assert call(r.port, "GET", path, headers=tenant).status == 401, path
        assert call(r.port, "GET", path, headers=ops).status == 200, path
    assert call(r.port, "GET", "/health").status == 200
    assert call(r.port, "GET", "/ready").status == 200


def test_operational_pages_stay_closed_by_default_with_tenant_keys(spawn: Spawner) -> None:
    keys = {"NW_T_KEY": "tenant-key-0123456789abcdef"}
    _, _, r = _pd(spawn, env=keys, tenants=[{"name": "a", "key_env": "NW_T_KEY"}])
    assert call(r.port, "GET", "/narwhal/state").status == 401
    assert call(r.port, "GET", "/narwhal/state",
                headers={"authorization": f"Bearer {keys['NW_T_KEY']}"}).status == 401


def test_a_standby_follows_a_keyed_primary_with_the_operator_key(spawn: Spawner) -> None:
    keys = {"NW_T_KEY": "tenant-key-0123456789abcdef", "NW_OPS_KEY": "ops-key-0123456789abcdef"}
    _, _, primary = _pd(spawn, env=keys, tenants=[{"name": "a", "key_env": "NW_T_KEY"}],
                        operations={"key_env": "NW_OPS_KEY"})
    standby = Router(primary.fleet, free_port(), keys, ("--standby-of", primary.url))
    spawn.routers.append(standby)
    standby.start(wait_ready=False)
    ops = {"authorization": f"Bearer {keys['NW_OPS_KEY']}"}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lead = call(standby.port, "GET", "/narwhal/state", headers=ops).json()["controller"]
        if lead["handoffs_applied"] >= 2:
            break
        time.sleep(0.1)
    assert lead["handoffs_applied"] >= 2 and lead["handoff_errors"] == 0
