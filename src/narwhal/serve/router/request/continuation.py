"""Continuing a stream on another engine after its decode engine failed mid-way.

When a decode leg breaks after the client already holds part of the answer, the router asks
another engine for the rest: the prompt plus the text already sent, as a fresh request (the
new engine prefills that text itself), with the token limits reduced by what was generated.
The client's stream goes on with the new engine's events rewritten to read as the first
engine's: its id and created time, no second role delta, usage counted over the whole
answer, logprob text offsets counted from the start of the answer.

What the client holds is read back from the bytes the router forwarded (`SentLog`), so the
common path parses nothing: a stream that never fails is never read. Every decision here is
a pure function of the request body, those bytes and two token counts; the proxy does the I/O.

Exactness: a greedy request continues with the tokens the unfaulted stream would have sent
when the sent text encodes back to the tokens that made it (true of the emulator's tokenizer
and of most text under a BPE tokenizer). Sampled requests continue plausibly: a seeded
sampler restarts its generator, and presence or frequency penalties count the first part as
prompt rather than output (docs/router.md "Continuing a broken stream").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from narwhal.serve.router.jsonio import dumps, loads
from narwhal.serve.router.request.reassemble import StreamError, sse_events
from narwhal.serve.router.request.relay import SentBytes

# The most a stream may have sent and still be continued.
MAX_SENT_BYTES = 16 * 1024 * 1024

# Body options whose state an engine cannot resume from text: the client is told the stream
# broke instead (an OpenAI-shaped error event).
_STRUCTURED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
               "structured_outputs")
_PENALTIES = ("presence_penalty", "frequency_penalty")


# Every body key the rules below read: a body with none of them continues (the common case).
_ASKED = frozenset({"echo", "prompt_logprobs", "response_format", "tools",
                    "continue_final_message", *_STRUCTURED})


def not_continuable(body: dict[str, Any], chat: bool) -> str:
    """Why a request cannot be continued from its text ("" when it can)."""
    if _ASKED.isdisjoint(body):
        return ""
    if body.get("echo"):
        return "echo repeats the prompt, which a continued request would change"
    if body.get("prompt_logprobs") is not None:
        return "prompt_logprobs would be sent again for a longer prompt"
    fmt = body.get("response_format")
    if (isinstance(fmt, dict) and fmt.get("type") not in (None, "text")) or any(
            body.get(k) is not None for k in _STRUCTURED):
        return "structured output restarts its grammar on a new request"
    if chat and body.get("tools") and body.get("tool_choice") != "none":
        return "tool calls are parsed from the whole answer"
    if chat and body.get("continue_final_message"):
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages and isinstance(messages[-1], dict)
                and isinstance(messages[-1].get("content"), str)):
            return "the final message to continue has no plain text content"
    return ""


def exact(body: dict[str, Any]) -> bool:
    """Whether the continued answer is the one the unfaulted stream would have given: greedy
    sampling, and no penalty that counts output tokens only."""
    greedy = body.get("temperature") == 0 or body.get("top_k") == 1
    return greedy and not any(body.get(k) for k in _PENALTIES)


@dataclass(slots=True)
class Sent:
    """What the client holds of a stream, read back from the events it was sent."""

    text: str = ""
    events: int = 0
    head: dict[str, Any] = field(default_factory=dict)  # id, created, model of the first event
    finish: str | None = None  # a finish_reason the client already has
    usage_sent: bool = False
    done: bool = False  # `data: [DONE]` went out
    unreadable: bool = False  # an event the client got is not JSON

    def read(self, payload: bytes, chat: bool) -> None:
        """Fold the SSE text `payload` (whole events) into what was sent; an event that is
        not JSON leaves the stream unreadable (it is not continued)."""
        try:
            events = sse_events(payload)
        except StreamError:
            self.unreadable = True
            return
        for doc in events:
            self.add(doc, chat)
        if payload.rstrip().endswith(b"[DONE]"):  # the last event (a JSON event ends in "}")
            self.done = True

    def add(self, doc: dict[str, Any], chat: bool) -> None:
        """One event the client was sent."""
        self.events += 1
        if not self.head:
            self.head = {k: doc[k] for k in ("id", "created", "model") if k in doc}
        if doc.get("usage"):
            self.usage_sent = True
        choices = doc.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            part = (delta.get("content") if isinstance(delta, dict) else None) if chat \
                else choice.get("text")
            if isinstance(part, str):
                self.text += part
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]


def sent_log(chat: bool, chunked: bool) -> SentBytes:
    """A relay's record of the bytes it forwards (relay.SentBytes), folding into a `Sent`."""
    return SentBytes(chat, chunked, Sent)


def read_back(log: SentBytes) -> Sent | None:
    """What the client holds; None when the stream is past what may be continued."""
    if log.total > MAX_SENT_BYTES:
        return None
    sent = log.fold()
    return sent if isinstance(sent, Sent) and not sent.unreadable else None


@dataclass(frozen=True)
class Counts:
    """Token counts a continuation needs: the prompt's, and the answer's so far."""

    prompt: int
    generated: int


def tokenize_body(body: dict[str, Any], chat: bool, text: str) -> dict[str, Any]:
    """The /tokenize request that counts the continued prompt (a token-id prompt: the text's
    own ids, appended to the prompt's)."""
    out: dict[str, Any] = {"model": body["model"]} if "model" in body else {}
    if chat:
        out["messages"] = continued_messages(body, text)
        out["add_generation_prompt"] = False
        out["continue_final_message"] = True
    elif isinstance(body.get("prompt"), list):
        out["prompt"] = text
        out["add_special_tokens"] = False
    else:
        out["prompt"] = body["prompt"] + text
    return out


def continued_messages(body: dict[str, Any], text: str) -> list[Any]:
    """The conversation with the answer so far as the final assistant message."""
    messages = list(body["messages"])
    if body.get("continue_final_message"):
        last = dict(messages[-1])
        last["content"] = last["content"] + text
        messages[-1] = last
        return messages
    return [*messages, {"role": "assistant", "content": text}]


def request_body(body: dict[str, Any], chat: bool, text: str, text_ids: list[int] | None,
                 counts: Counts, stream_options: Any) -> bytes:
    """The continued request: the client's own body with the prompt extended by the answer
    so far and the token limits reduced by what was generated."""
    out = dict(body)
    out.pop("kv_transfer_params", None)
    if chat:
        out["messages"] = continued_messages(body, text)
        out["add_generation_prompt"] = False
        out["continue_final_message"] = True
    elif text_ids is not None:
        out["prompt"] = [*body["prompt"], *text_ids]
    else:
        out["prompt"] = body["prompt"] + text
    for key in ("max_tokens", "max_completion_tokens"):
        if type(body.get(key)) is int:
            out[key] = body[key] - counts.generated
    if type(body.get("min_tokens")) is int:
        out["min_tokens"] = max(0, body["min_tokens"] - counts.generated)
    out["stream"] = True
    if stream_options is not None:
        out["stream_options"] = stream_options
    return dumps(out)


def counts_from(body: dict[str, Any], prompt_tokens: int,
                answer: dict[str, Any]) -> tuple[Counts, list[int] | None] | None:
    """The counts from the engine's /tokenize `answer` to `tokenize_body` (a token-id
    prompt: the answer's ids, which the continued prompt appends); None when it is not one."""
    count, ids = answer.get("count"), answer.get("tokens")
    if type(count) is not int:
        return None
    if isinstance(body.get("prompt"), list):
        if not isinstance(ids, list) or len(ids) != count or not all(type(t) is int for t in ids):
            return None
        return Counts(prompt_tokens, count), ids
    generated = count - prompt_tokens
    return (Counts(prompt_tokens, generated), None) if generated >= 0 else None


def remaining(body: dict[str, Any], chat: bool, generated: int) -> int | None:
    """Tokens the client may still receive (None: no limit asked)."""
    limit = body.get("max_completion_tokens") if chat else None
    if limit is None:
        limit = body.get("max_tokens")
    return limit - generated if type(limit) is int else None


class Rewriter:
    """Makes the continuing engine's events read as the first engine's, and adds each event
    it passes on to `sent` (a later failure continues from there)."""

    __slots__ = ("chat", "counts", "head", "offset", "pending", "sent")

    def __init__(self, sent: Sent, counts: Counts, chat: bool) -> None:
        self.sent = sent
        self.head = dict(sent.head)
        self.counts = counts
        self.chat = chat
        self.offset = len(sent.text)  # completions' logprobs text_offset is answer-relative
        self.pending = b""  # an event a read boundary split

    def feed(self, payload: bytes) -> bytes:
        """The client's SSE text for the engine's `payload` (whole events only; a split
        event waits for its end)."""
        data = self.pending + payload
        end = data.rfind(b"\n\n")
        if end < 0:
            self.pending = data
            return b""
        self.pending = data[end + 2:]
        out = [self.event(block) for block in data[:end].split(b"\n\n")]
        return b"".join(out)

    def event(self, block: bytes) -> bytes:
        line = block.strip()
        if not line.startswith(b"data:"):
            return b""
        data = line[5:].strip()
        if data == b"[DONE]":
            self.sent.done = True
            return b"data: [DONE]\n\n"
        try:
            doc = loads(data)
        except ValueError:
            return b"data: " + data + b"\n\n"
        if not isinstance(doc, dict) or "error" in doc:
            return b"data: " + data + b"\n\n"
        if not self._rewrite(doc):
            return b""
        self.sent.add(doc, self.chat)
        return b"data: " + dumps(doc) + b"\n\n"

    def _rewrite(self, doc: dict[str, Any]) -> bool:
        """Rewrite one event in place; False drops it (the new engine's opening role delta)."""
        doc.update(self.head)
        usage = doc.get("usage")
        if isinstance(usage, dict) and type(usage.get("completion_tokens")) is int:
            completion = usage["completion_tokens"] + self.counts.generated
            usage["prompt_tokens"] = self.counts.prompt
            usage["completion_tokens"] = completion
            usage["total_tokens"] = self.counts.prompt + completion
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices:
            return True
        keep = False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            keep = self._choice(choice) or keep
        return keep or bool(doc.get("usage"))

    def _choice(self, choice: dict[str, Any]) -> bool:
        if self.chat:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)
                if delta.get("content") == "" and len(delta) == 1 \
                        and not choice.get("finish_reason") and not choice.get("logprobs"):
                    return False
            return True
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("text_offset"), list):
            logprobs["text_offset"] = [o + self.offset if type(o) is int else o
                                       for o in logprobs["text_offset"]]
        return True


def closing_events(sent: Sent, counts: Counts, chat: bool, include_usage: bool,
                   finish: str | None) -> bytes:
    """The end of a stream whose answer was whole when its engine failed (a finish reason
    sent, or the token limit reached): a finish event when the client has none, the usage
    event it asked for, `[DONE]`."""
    out = b""
    if finish is not None and sent.finish is None:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        out += b"data: " + dumps({**sent.head, "choices": [choice]}) + b"\n\n"
    if include_usage and not sent.usage_sent:
        usage = {"prompt_tokens": counts.prompt, "completion_tokens": counts.generated,
                 "total_tokens": counts.prompt + counts.generated}
        out += b"data: " + dumps({**sent.head, "choices": [], "usage": usage}) + b"\n\n"
    if not sent.done:
        out += b"data: [DONE]\n\n"
    return out
