"""A non-streaming client gets the body vLLM would have returned, rebuilt from the stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.serve.router.request.reassemble import StreamError, reassemble


def _sse(*events: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


HEAD = {"id": "cmpl-1", "created": 5, "model": "m"}


def test_completion_text_logprobs_and_usage_are_joined() -> None:
    raw = _sse(
        {**HEAD, "object": "text_completion", "choices": [
            {"index": 0, "text": "Hel", "logprobs": {"tokens": ["Hel"], "token_logprobs": [-1.0]},
             "finish_reason": None, "token_ids": [5]}]},
        {**HEAD, "object": "text_completion", "choices": [
            {"index": 0, "text": "lo", "logprobs": {"tokens": ["lo"], "token_logprobs": [-0.5]},
             "finish_reason": "stop", "stop_reason": None, "token_ids": [6]}]},
        {**HEAD, "object": "text_completion", "choices": [],
         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    )
    body = reassemble(raw, chat=False)
    assert body["object"] == "text_completion"
    assert body["id"] == "cmpl-1" and body["model"] == "m"
    (choice,) = body["choices"]
    assert choice["text"] == "Hello"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {"tokens": ["Hel", "lo"], "token_logprobs": [-1.0, -0.5]}
    assert choice["token_ids"] == [5, 6]
    assert body["usage"]["total_tokens"] == 5


def test_chat_deltas_become_one_message_with_merged_tool_calls() -> None:
    raw = _sse(
        {**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "get", "arguments": '{"a":'}}]}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": " 1}"}}]}, "finish_reason": "tool_calls"}]},
    )
    body = reassemble(raw, chat=True)
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"] == ""
    assert message["tool_calls"] == [{"id": "call_1", "type": "function",
                                      "function": {"name": "get", "arguments": '{"a": 1}'}}]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_an_error_event_becomes_an_error_with_its_status() -> None:
    raw = _sse({"error": {"message": "prompt too long", "code": 400}})
    with pytest.raises(StreamError) as info:
        reassemble(raw, chat=False)
    assert info.value.status == 400 and "too long" in str(info.value)


def test_an_empty_or_garbled_stream_is_an_engine_error() -> None:
    with pytest.raises(StreamError):
        reassemble(b"data: [DONE]\n\n", chat=False)
    with pytest.raises(StreamError):
        reassemble(b"data: {not json\n\n", chat=False)


def test_a_reassembled_body_keeps_the_system_fingerprint_of_the_usage_chunk() -> None:
    """vLLM 0.32.0 puts system_fingerprint on the final usage chunk only (a real capture)."""
    from pathlib import Path

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32.0"
    whole = json.loads((fixtures / "completion.json").read_text())
    body = reassemble((fixtures / "completion-stream.sse").read_bytes(), chat=False)
    assert body["system_fingerprint"] == whole["system_fingerprint"]
    assert body["system_fingerprint"].startswith("vllm-")
