"""What a client of vLLM's OpenAI server sees, as assertions on real reply bodies.

These are the shapes vLLM 0.32.0 returns on /v1/completions and /v1/chat/completions; a router
that relays an engine's reply unchanged (vllm-router) or reassembles it (narwhal-inference)
must still hand the client these shapes.
"""

from __future__ import annotations

from typing import Any

FINISH_REASONS = ("length", "stop")


def _usage(usage: Any, max_tokens: int) -> None:
    assert isinstance(usage, dict), f"usage is not an object: {usage!r}"
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    assert isinstance(prompt, int) and prompt > 0, f"usage.prompt_tokens: {usage!r}"
    assert isinstance(completion, int) and 1 <= completion <= max_tokens, f"usage: {usage!r}"
    assert usage.get("total_tokens") == prompt + completion, f"usage.total_tokens: {usage!r}"


def _head(body: dict[str, Any], obj: str, prefix: str, model: str) -> None:
    assert body.get("object") == obj, f"object {body.get('object')!r}, want {obj!r}"
    assert isinstance(body.get("id"), str) and body["id"].startswith(prefix), body.get("id")
    assert isinstance(body.get("created"), int), f"created: {body.get('created')!r}"
    assert body.get("model") == model, f"model {body.get('model')!r}, want {model!r}"


def completion_body(body: Any, *, chat: bool, model: str, max_tokens: int) -> str:
    """Assert a non-streaming reply's shape; return its generated text."""
    assert isinstance(body, dict), f"reply is not an object: {body!r}"
    if chat:
        _head(body, "chat.completion", "chatcmpl-", model)
    else:
        _head(body, "text_completion", "cmpl-", model)
    choices = body.get("choices")
    assert isinstance(choices, list) and len(choices) == 1, f"choices: {choices!r}"
    choice = choices[0]
    assert choice.get("index") == 0, choice
    assert choice.get("finish_reason") in FINISH_REASONS, choice
    if chat:
        message = choice.get("message")
        assert isinstance(message, dict) and message.get("role") == "assistant", choice
        text = message.get("content")
    else:
        text = choice.get("text")
    assert isinstance(text, str) and text, f"no generated text: {choice!r}"
    _usage(body.get("usage"), max_tokens)
    if choice["finish_reason"] == "length":
        assert body["usage"]["completion_tokens"] == max_tokens, body["usage"]
    return text


def stream_chunks(
    chunks: list[dict[str, Any]], done: bool, *, chat: bool, model: str, max_tokens: int,
    usage_chunk: bool,
) -> str:
    """Assert an SSE reply's chunks; return the generated text they carry."""
    assert done, "stream did not end with data: [DONE]"
    assert chunks, "stream carried no chunks"
    obj, prefix = ("chat.completion.chunk", "chatcmpl-") if chat else ("text_completion", "cmpl-")
    ids = {chunk.get("id") for chunk in chunks}
    assert len(ids) == 1, f"chunk ids differ: {ids}"
    pieces: list[str] = []
    finish: list[str] = []
    usage = None
    for chunk in chunks:
        _head(chunk, obj, prefix, model)
        choices = chunk.get("choices")
        assert isinstance(choices, list), chunk
        if not choices:
            usage = chunk.get("usage")
            continue
        assert len(choices) == 1 and choices[0].get("index") == 0, chunk
        choice = choices[0]
        if chat:
            delta = choice.get("delta")
            assert isinstance(delta, dict), chunk
            assert delta.get("role") in (None, "assistant"), chunk
            pieces.append(delta.get("content") or "")
        else:
            assert isinstance(choice.get("text"), str), chunk
            pieces.append(choice["text"])
        if choice.get("finish_reason") is not None:
            finish.append(choice["finish_reason"])
    assert len(finish) == 1 and finish[0] in FINISH_REASONS, f"finish reasons: {finish}"
    if chat:
        first = chunks[0]["choices"][0]["delta"]
        assert first.get("role") == "assistant", f"first chat delta has no role: {first}"
    if usage_chunk:
        _usage(usage, max_tokens)
    text = "".join(pieces)
    assert text, "stream carried no generated text"
    return text
