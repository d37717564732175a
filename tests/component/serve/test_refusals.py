"""What a client gets for a request the router will not serve: OpenAI-shaped errors, no legs."""

from __future__ import annotations

import socket

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, call, journal_rows

pytestmark = pytest.mark.timeout(120)
OK_BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
KEY_A = "key-for-team-a-0123456789abcdef"


def _is_openai_error(reply_json: dict[str, object]) -> None:
    err = reply_json["error"]
    assert isinstance(err, dict)
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": MODEL, "max_tokens": 2}, 400, "prompt"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt"),
    ({"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ({"model": MODEL, "prompt": "x", "kv_transfer_params": {"do_remote_decode": True}}, 400,
     "kv_transfer_params"),
    ({"model": "other-model", "prompt": "x"}, 404, "model"),
])
def test_a_bad_completion_body_is_refused_naming_the_field(
        shared: Spawner, body: dict[str, object], status: int, param: str) -> None:
    p, d = shared.engines
    r = shared.routers[0]
    before = len(p.calls()) + len(d.calls())
    reply = call(r.port, "POST", "/v1/completions", body)
    assert reply.status == status
    _is_openai_error(reply.json())
    assert reply.json()["error"]["param"] == param
    assert len(p.calls()) + len(d.calls()) == before


def test_bodies_that_are_not_json_objects_and_chat_without_messages_are_400(shared: Spawner) -> None:
    r = shared.routers[0]
    for raw in (b"{not json", b"[1,2]", b"\xff\xfe"):
        reply = call(r.port, "POST", "/v1/completions", raw=raw)
        assert reply.status == 400
        _is_openai_error(reply.json())
    reply = call(r.port, "POST", "/v1/chat/completions", {"model": MODEL, "messages": []})
    assert reply.status == 400 and reply.json()["error"]["param"] == "messages"


def test_unknown_route_is_404_and_wrong_method_is_405(shared: Spawner) -> None:
    r = shared.routers[0]
    reply = call(r.port, "GET", "/v1/embeddings")
    assert reply.status == 404
    _is_openai_error(reply.json())
    reply = call(r.port, "GET", "/v1/completions")
    assert reply.status == 405 and reply.headers["allow"] == "POST"
    assert call(r.port, "POST", "/metrics", OK_BODY).status == 405


def test_a_request_id_that_cannot_be_forwarded_safely_is_400(shared: Spawner) -> None:
    r = shared.routers[0]
    reply = call(r.port, "POST", "/v1/completions", OK_BODY, {"x-request-id": "a b/c"})
    assert reply.status == 400 and reply.json()["error"]["param"] == "x-request-id"
    reply = call(r.port, "POST", "/v1/completions", OK_BODY, {"x-request-id": "x" * 129})
    assert reply.status == 400


def test_a_body_over_the_limit_is_413_before_it_is_read(spawn: Spawner) -> None:
    p, _, r = spawn.pd(serving={"max_request_bytes": 4096})
    big = {"model": MODEL, "prompt": "w " * 5000}
    reply = call(r.port, "POST", "/v1/completions", big)
    assert reply.status == 413
    _is_openai_error(reply.json())
    assert reply.json()["error"]["code"] == "request_too_large"
    assert p.calls() == []
    assert call(r.port, "POST", "/v1/completions", OK_BODY).status == 200  # still serving


def test_a_chunked_body_over_the_limit_is_413_too(spawn: Spawner) -> None:
    _, _, r = spawn.pd(serving={"max_request_bytes": 4096})
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
                  b"content-type: application/json\r\n\r\n")
        chunk = b"a" * 3000
        for _ in range(3):
            s.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        s.sendall(b"0\r\n\r\n")
        data = s.recv(65536)
    assert data.startswith(b"HTTP/1.1 413 ")


def test_tenant_keys_are_required_when_tenants_are_configured(spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")],
                     env={"NW_TEST_KEY_A": KEY_A},
                     tenants=[{"name": "team-a", "key_env": "NW_TEST_KEY_A"}])
    for headers in ({}, {"authorization": "Bearer wrong-key-wrong-key-00"},
                    {"authorization": f"Basic {KEY_A}"}):
        reply = call(r.port, "POST", "/v1/completions", OK_BODY, headers)
        assert reply.status == 401
        assert reply.headers["www-authenticate"] == "Bearer"
        _is_openai_error(reply.json())
    assert call(r.port, "GET", "/v1/models").status == 401
    assert p.calls() == []
    good = call(r.port, "POST", "/v1/completions", OK_BODY, {"authorization": f"Bearer {KEY_A}"})
    assert good.status == 200
    rows = journal_rows(spawn.journal, 1)
    assert [row["tenant"] for row in rows] == ["team-a"]  # refusals are not journaled
    assert call(r.port, "GET", "/health").status == 200  # operational routes stay open
    assert call(r.port, "GET", "/v1/models", headers={"authorization": f"Bearer {KEY_A}"}).status == 200


def test_over_the_concurrency_limit_is_429_with_retry_after(spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0", "--token-gap-ms", "200")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")],
                     serving={"max_concurrent": 1})
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as slow:
        body = b'{"model":"mini-model","prompt":"x","max_tokens":10,"stream":true}'
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%b"
                     % (len(body), body))
        slow.recv(100)  # the stream has started
        reply = call(r.port, "POST", "/v1/completions", OK_BODY)
    assert reply.status == 429
    assert reply.headers["retry-after"] == "1"
