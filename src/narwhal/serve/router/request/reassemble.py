"""Turn a decode leg's SSE stream back into the JSON body a non-streaming client expects.

The decode leg is always streamed (so the router sees first-token time and a mid-leg failure
the same way for every client); a client that did not ask for a stream gets the body vLLM
would have returned: text or message content joined per choice, logprobs and token ids
concatenated, the last finish reason, and the usage from the final usage event.
"""

from __future__ import annotations

from typing import Any

from narwhal.serve.router.jsonio import loads


class StreamError(Exception):
    """The stream carried an error event or could not be read."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of every `data:` event, without `[DONE]`."""
    events: list[dict[str, Any]] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                value = loads(payload)
            except ValueError:
                raise StreamError("decode engine sent an event that is not JSON", 502) from None
            if isinstance(value, dict):
                events.append(value)
    return events


def _merge_logprobs(into: dict[str, Any] | None, part: Any) -> dict[str, Any] | None:
    if not isinstance(part, dict):
        return into
    if into is None:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in part.items()}
    for key, value in part.items():
        if isinstance(value, list) and isinstance(into.get(key), list):
            into[key].extend(value)
        elif key not in into:
            into[key] = value
    return into


def _merge_tool_calls(into: list[dict[str, Any]], deltas: list[Any]) -> None:
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        index = delta.get("index", len(into))
        while len(into) <= index:
            into.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        call = into[index]
        if delta.get("id"):
            call["id"] = delta["id"]
        if delta.get("type"):
            call["type"] = delta["type"]
        fn = delta.get("function") or {}
        if fn.get("name"):
            call["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            call["function"]["arguments"] += fn["arguments"]


class _Choice:
    __slots__ = ("finish_reason", "logprobs", "prompt_token_ids", "reasoning", "role", "stop_reason",
                 "text", "token_ids", "tool_calls")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.role = "assistant"
        self.finish_reason: Any = None
        self.stop_reason: Any = None
        self.logprobs: dict[str, Any] | None = None
        self.token_ids: list[int] | None = None
        self.prompt_token_ids: Any = None
        self.tool_calls: list[dict[str, Any]] = []

    def add(self, c: dict[str, Any], chat: bool) -> None:
        if chat:
            delta = c.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    self.reasoning.append(delta[key])
            if isinstance(delta.get("role"), str):
                self.role = delta["role"]
            if isinstance(delta.get("tool_calls"), list):
                _merge_tool_calls(self.tool_calls, delta["tool_calls"])
        elif isinstance(c.get("text"), str):
            self.text.append(c["text"])
        if c.get("finish_reason") is not None:
            self.finish_reason = c["finish_reason"]
        if c.get("stop_reason") is not None:
            self.stop_reason = c["stop_reason"]
        self.logprobs = _merge_logprobs(self.logprobs, c.get("logprobs"))
        if isinstance(c.get("token_ids"), list):
            self.token_ids = (self.token_ids or []) + c["token_ids"]
        if c.get("prompt_token_ids") is not None:
            self.prompt_token_ids = c["prompt_token_ids"]

    def render(self, index: int, chat: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index}
        if chat:
            message: dict[str, Any] = {"role": self.role, "content": "".join(self.text)}
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
            if self.tool_calls:
                message["tool_calls"] = self.tool_calls
            out["message"] = message
        else:
            out["text"] = "".join(self.text)
        out["logprobs"] = self.logprobs
        out["finish_reason"] = self.finish_reason
        out["stop_reason"] = self.stop_reason
        if self.token_ids is not None:
            out["token_ids"] = self.token_ids
        if self.prompt_token_ids is not None:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out


def reassemble(raw: bytes, chat: bool, want_usage: bool = True) -> dict[str, Any]:
    """One vLLM-shaped completion (or chat.completion) body from a streamed leg."""
    events = sse_events(raw)
    if not events:
        raise StreamError("decode engine ended the stream without any event", 502)
    first = events[0]
    choices: dict[int, _Choice] = {}
    usage: Any = None
    carried: dict[str, Any] = {}  # vLLM sets system_fingerprint on the final usage chunk only
    for event in events:
        if "error" in event:
            err = event["error"] if isinstance(event["error"], dict) else {"message": str(event["error"])}
            code = err.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 502
            raise StreamError(str(err.get("message", "decode engine reported an error")), status)
        if event.get("usage") is not None:
            usage = event["usage"]
        for key in ("system_fingerprint", "service_tier"):
            if event.get(key) is not None:
                carried[key] = event[key]
        for c in event.get("choices") or []:
            if isinstance(c, dict):
                choices.setdefault(int(c.get("index", 0)), _Choice()).add(c, chat)
    body: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion" if chat else "text_completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": [choices[i].render(i, chat) for i in sorted(choices)],
    }
    for key in ("system_fingerprint", "service_tier"):
        if key in carried:
            body[key] = carried[key]
        elif key in first:
            body[key] = first[key]
    if want_usage:
        body["usage"] = usage
    return body
