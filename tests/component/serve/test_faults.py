"""Engine failures: mid-stream crashes, retries before the first byte, ejection and readmission."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, MiniEngine, call, journal_rows

pytestmark = pytest.mark.timeout(120)
STREAM = {"model": MODEL, "prompt": "one two three", "max_tokens": 8, "stream": True}
FAST_HEALTH = {"eject_after_failures": 2, "probe_interval_s": 0.2, "probe_timeout_s": 0.5}


def _engine_state(port: int, engine_id: str) -> dict[str, Any]:
    state = call(port, "GET", "/narwhal/state").json()
    return next(e for e in state["engines"] if e["id"] == engine_id)


def _wait_for(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_decode_engine_crash_mid_stream_ends_the_stream_with_an_error_event(
        spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0", "--crash-after", "3")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")])
    reply = call(r.port, "POST", "/v1/completions", STREAM, {"x-request-id": "crash-1"})
    assert reply.status == 200
    events = reply.events()
    assert [e["choices"][0]["text"] for e in events[:3]] == [" tok0", " tok1", " tok2"]
    assert events[3]["error"]["code"] == "engine_failed"
    assert "mid-stream" in events[3]["error"]["message"]
    assert events[4:] == ["[DONE]"]
    (row,) = journal_rows(spawn.journal, 1)
    assert row["request_id"] == "crash-1"
    assert row["outcome"] == "decode_failed_midstream"
    assert row["decode_engine"] == "d0"
    assert row["decode_attempts"] == 1  # bytes had reached the client: never retried


def test_a_non_streaming_request_whose_decode_engine_crashes_gets_a_502(spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0", "--crash-after", "2")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")])
    reply = call(r.port, "POST", "/v1/completions", {**STREAM, "stream": False})
    assert reply.status == 502
    assert reply.json()["error"]["code"] == "engine_failed"
    (row,) = journal_rows(spawn.journal, 1)
    assert row["outcome"] == "decode_failed_midstream"


def test_a_decode_leg_refused_before_any_byte_is_retried_on_another_engine(
        spawn: Spawner) -> None:
    p = spawn.engine("p0")
    bad = spawn.engine("d0", "--decode-status", "503")
    good = spawn.engine("d1")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", bad.url, "decode"),
                      ("d1", good.url, "decode")])
    for _ in range(4):
        reply = call(r.port, "POST", "/v1/completions", STREAM)
        assert reply.status == 200
        assert reply.events()[-1] == "[DONE]"
    rows = journal_rows(spawn.journal, 4)
    assert all(row["decode_engine"] == "d1" and row["outcome"] == "ok" for row in rows)
    retried = [row for row in rows if row["decode_attempts"] == 2]
    assert retried and len(retried) == len(bad.calls())
    text = call(r.port, "GET", "/metrics").body.decode()
    assert f'narwhal_router_leg_retries_total{{leg="decode"}} {float(len(retried))}' in text


def test_a_decode_leg_whose_stream_opens_with_an_error_is_computed_afresh_elsewhere(
        spawn: Spawner) -> None:
    """vLLM answers a streamed decode leg whose KV it could not pull with 200 and an error
    event: no token reached the client, so another engine answers, computing the prompt
    itself (the KV it was to pull is what failed)."""
    p = spawn.engine("p0")
    bad = spawn.engine("d0", "--kv-fails")
    good = spawn.engine("d1")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", bad.url, "decode"),
                      ("d1", good.url, "decode")])
    for n in range(4):
        reply = call(r.port, "POST", "/v1/completions", STREAM, {"x-request-id": f"kv-{n}"})
        assert reply.status == 200
        events = reply.events()
        assert not any("error" in e for e in events[:-1]), events
        assert [e["choices"][0]["text"] for e in events[:-1]] == [f" tok{k}" for k in range(8)]
    rows = journal_rows(spawn.journal, 4)
    assert all(row["decode_engine"] == "d1" and row["outcome"] == "ok" for row in rows)
    retried = [row for row in rows if row["decode_attempts"] == 2]
    assert retried and len(retried) == len(bad.calls())
    legs = [c for c in good.calls() if not (c["body"].get("kv_transfer_params") or {})
            .get("do_remote_decode")]
    # a retried leg reached d1 with no KV to pull; the others pulled theirs as usual
    assert sum(not c["body"].get("kv_transfer_params") for c in legs) == len(retried)


def test_an_unreachable_decode_engine_is_retried_then_ejected_then_readmitted(
        spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d0 = spawn.engine("d0")
    d1 = spawn.engine("d1")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d0.url, "decode"),
                      ("d1", d1.url, "decode")], health=FAST_HEALTH)
    d0.kill()
    for _ in range(4):
        assert call(r.port, "POST", "/v1/completions", STREAM).status == 200
    assert _wait_for(lambda: not _engine_state(r.port, "d0")["admitted"])
    assert "failures" in _engine_state(r.port, "d0")["ejected_reason"]
    assert 'narwhal_router_engine_admitted{engine="d0",role="decode"} 0.0' in \
        call(r.port, "GET", "/metrics").body.decode()
    revived = MiniEngine("d0", d0.port, d0.record)
    spawn.engines.append(revived)
    revived.start()
    assert _wait_for(lambda: _engine_state(r.port, "d0")["admitted"])


def test_an_idle_fleet_finds_a_dead_engine_without_traffic(spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")], health=FAST_HEALTH)
    d.kill()
    assert _wait_for(lambda: not _engine_state(r.port, "d0")["admitted"])
    ready = call(r.port, "GET", "/ready")
    assert ready.status == 503
    assert "decode" in ready.json()["reason"]
    reply = call(r.port, "POST", "/v1/completions", STREAM)
    assert reply.status == 503
    assert reply.json()["error"]["code"] == "no_engine"


def test_a_prefill_engine_without_a_kv_connector_is_reported_not_hidden(spawn: Spawner) -> None:
    p = spawn.engine("p0", "--no-kv")
    d = spawn.engine("d0")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")])
    reply = call(r.port, "POST", "/v1/completions", STREAM)
    assert reply.status == 502
    assert "kv_transfer_params" in reply.json()["error"]["message"]
    assert d.calls() == []
    (row,) = journal_rows(spawn.journal, 1)
    assert row["outcome"] == "no_handoff"


def test_a_decode_engine_silent_before_its_first_byte_is_replaced_and_probed(
        spawn: Spawner) -> None:
    p = spawn.engine("p0")
    slow = spawn.engine("d0", "--first-token-delay-ms", "3000")
    fast = spawn.engine("d1")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", slow.url, "decode"),
                      ("d1", fast.url, "decode")], serving={"first_token_timeout_s": 0.4})
    for _ in range(3):
        reply = call(r.port, "POST", "/v1/completions", STREAM)
        assert reply.status == 200 and reply.events()[-1] == "[DONE]"
    rows = journal_rows(spawn.journal, 3)
    assert all(row["decode_engine"] == "d1" for row in rows)
    assert any(row["decode_attempts"] == 2 for row in rows)
    assert _engine_state(r.port, "d0")["admitted"]  # slow, not dead: its /health still answers


def test_a_stream_that_goes_silent_ends_with_a_timeout_event(spawn: Spawner) -> None:
    p = spawn.engine("p0")
    d = spawn.engine("d0", "--stall-after", "2")
    r = spawn.router([("p0", p.url, "prefill"), ("d0", d.url, "decode")],
                     serving={"stream_idle_timeout_s": 0.5})
    reply = call(r.port, "POST", "/v1/completions", STREAM)
    events = reply.events()
    assert [e["choices"][0]["text"] for e in events[:2]] == [" tok0", " tok1"]
    assert events[2]["error"]["code"] == "engine_timeout"
    assert events[3:] == ["[DONE]"]
    (row,) = journal_rows(spawn.journal, 1)
    assert row["outcome"] == "decode_timeout"
