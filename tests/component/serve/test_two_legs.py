"""Requests cross the router as two legs on real engine processes, and clients get vLLM shapes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.component.serve.conftest import Spawner
from tests.component.serve.harness import MODEL, call, journal_rows

pytestmark = pytest.mark.timeout(120)

PROMPT = {"model": MODEL, "prompt": "the quick brown fox jumps", "max_tokens": 5}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def _legs(calls: list[dict[str, Any]], rid: str) -> list[dict[str, Any]]:
    return [c for c in calls if c["x_request_id"] and c["x_request_id"].startswith(rid)]


def _engine_id(journal: Any, client_rid: str) -> str:
    """The router-made id the engines saw for the request the client called `client_rid`."""
    (row,) = [r for r in journal_rows(journal, 1) if r["request_id"] == client_rid]
    return str(row["engine_request_id"])


def test_streamed_completion_runs_prefill_then_decode_with_the_producers_params_unchanged(
        spawn: Spawner) -> None:
    p, d, r = spawn.pd()
    reply = call(r.port, "POST", "/v1/completions", {**PROMPT, "stream": True},
                 {"x-request-id": "client-rid-1"})
    assert reply.status == 200
    assert reply.headers["x-request-id"] == "client-rid-1"
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "".join(e["choices"][0]["text"] for e in chunks) == " tok0 tok1 tok2 tok3 tok4"
    assert all(e["object"] == "text_completion" for e in chunks)

    leg_id = _engine_id(spawn.journal, "client-rid-1")
    assert leg_id.startswith("nw-") and "client-rid-1" not in leg_id
    (prefill,) = _legs(p.calls(), leg_id)
    assert prefill["x_request_id"] == f"{leg_id}-prefill"
    assert prefill["body"]["max_tokens"] == 1
    assert prefill["body"]["stream"] is False
    assert prefill["body"]["kv_transfer_params"] == {"do_remote_decode": True}
    assert prefill["body"]["prompt"] == PROMPT["prompt"]

    (decode,) = _legs(d.calls(), leg_id)
    assert decode["x_request_id"] == leg_id
    assert decode["body"]["kv_transfer_params"] == prefill["produced"]
    assert decode["body"]["stream"] is True
    assert decode["body"]["max_tokens"] == 5
    assert "return_token_ids" not in decode["body"]


def test_non_streaming_completion_gets_one_reassembled_body_with_usage(spawn: Spawner) -> None:
    _, d, r = spawn.pd()
    reply = call(r.port, "POST", "/v1/completions", PROMPT)
    assert reply.status == 200
    body = reply.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == " tok0 tok1 tok2 tok3 tok4"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    assert reply.headers["x-request-id"]
    (decode,) = d.calls()
    assert decode["body"]["stream"] is True  # the decode leg streams; the router reassembles


def test_chat_prefill_caps_both_token_limits_and_streams_back_chat_chunks(spawn: Spawner) -> None:
    p, d, r = spawn.pd()
    reply = call(r.port, "POST", "/v1/chat/completions", {**CHAT, "stream": True})
    assert reply.status == 200
    chunks = reply.events()[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        " tok0 tok1 tok2 tok3"
    (prefill,) = p.calls()
    assert prefill["path"] == "/v1/chat/completions"
    assert prefill["body"]["max_tokens"] == 1
    assert prefill["body"]["max_completion_tokens"] == 1
    (decode,) = d.calls()
    assert decode["body"]["kv_transfer_params"] == prefill["produced"]
    assert decode["body"]["messages"] == CHAT["messages"]


def test_non_streaming_chat_is_reassembled_into_one_message(spawn: Spawner) -> None:
    _, _, r = spawn.pd()
    reply = call(r.port, "POST", "/v1/chat/completions", CHAT)
    assert reply.status == 200
    body = reply.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " tok0 tok1 tok2 tok3"}
    assert body["usage"]["completion_tokens"] == 4


def test_usage_in_a_stream_only_when_the_client_asked(spawn: Spawner) -> None:
    _, _, r = spawn.pd()
    plain = call(r.port, "POST", "/v1/completions", {**PROMPT, "stream": True}).events()
    assert not any(isinstance(e, dict) and e.get("usage") for e in plain)
    asked = call(r.port, "POST", "/v1/completions",
                 {**PROMPT, "stream": True, "stream_options": {"include_usage": True}}).events()
    assert asked[-2]["usage"]["completion_tokens"] == 5


def test_both_legs_on_one_engine_become_one_plain_request(spawn: Spawner) -> None:
    e = spawn.engine("b0")
    r = spawn.router([("b0", e.url, "both")])
    reply = call(r.port, "POST", "/v1/completions", {**PROMPT, "stream": True},
                 {"x-request-id": "solo-1"})
    assert reply.status == 200
    (only,) = e.calls()
    assert "kv_transfer_params" not in only["body"]
    (row,) = journal_rows(spawn.journal, 1)
    assert only["x_request_id"] == row["engine_request_id"] != "solo-1"
    assert row["mode"] == "single"
    assert row["prefill_engine"] == row["decode_engine"] == "b0"


def test_each_request_leaves_one_journal_row_naming_engines_and_timings(spawn: Spawner) -> None:
    _, _, r = spawn.pd()
    call(r.port, "POST", "/v1/completions", {**PROMPT, "stream": True}, {"x-request-id": "j-1"})
    call(r.port, "POST", "/v1/chat/completions", CHAT, {"x-request-id": "j-2"})
    rows = journal_rows(spawn.journal, 2)
    assert [row["request_id"] for row in rows] == ["j-1", "j-2"]
    first = rows[0]
    assert first["schema"] == "narwhal.journal"
    assert (first["prefill_engine"], first["decode_engine"]) == ("p0", "d0")
    assert first["outcome"] == "ok" and first["status"] == 200
    assert first["prompt_tokens"] == 5  # exact, from the prefill leg's usage
    assert first["ttft_s"] > 0 and first["handoff_s"] >= 0 and first["prefill_s"] > 0
    assert rows[1]["route"] == "chat" and rows[1]["stream"] is False


def test_tokenize_mode_measures_the_prompt_on_the_engine_first(spawn: Spawner) -> None:
    p, _, r = spawn.pd(serving={"prompt_length": "tokenize"})
    call(r.port, "POST", "/v1/completions", {**PROMPT, "stream": True})
    assert [c["path"] for c in p.calls()] == ["/tokenize", "/v1/completions"]
    (row,) = journal_rows(spawn.journal, 1)
    assert row["prompt_tokens"] == 5


def test_an_assigned_request_id_reaches_both_engines_and_the_client(spawn: Spawner) -> None:
    p, d, r = spawn.pd()
    reply = call(r.port, "POST", "/v1/completions", PROMPT)
    rid = reply.headers["x-request-id"]
    assert p.calls()[0]["x_request_id"] == f"{rid}-prefill"
    assert d.calls()[0]["x_request_id"] == rid
    assert not reply.json()["id"].endswith("-decode")


def test_models_health_ready_and_metrics_answer(spawn: Spawner) -> None:
    _, _, r = spawn.pd()
    models = call(r.port, "GET", "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert call(r.port, "GET", "/health").status == 200
    assert call(r.port, "GET", "/ready").json() == {"ready": True, "reason": "ready"}
    call(r.port, "POST", "/v1/completions", {**PROMPT, "stream": True})
    text = call(r.port, "GET", "/metrics").body.decode()
    assert 'narwhal_router_requests_total{outcome="ok",route="completions"} 1.0' in text
    assert 'narwhal_router_ttft_seconds_bucket{le="2.0"} 1.0' in text  # an SLO edge (ttft 2 s)
    assert "narwhal_router_tpot_seconds_bucket" in text
    assert "narwhal_router_handoff_seconds_count 1.0" in text
    assert "narwhal_router_event_loop_lag_seconds_count" in text
    assert "narwhal_router_journal_dropped_rows_total 0.0" in text
    state = call(r.port, "GET", "/narwhal/state").json()
    assert [e["id"] for e in state["engines"]] == ["p0", "d0"]
