"""Response bodies and SSE chunks, key for key as vLLM's OpenAI server writes them.

Non-streaming bodies list every field (vLLM dumps the whole model, nulls included); streamed
chunks list only the fields vLLM sets on them (it dumps with exclude_unset), and the final
usage chunk drops nulls. JSON is compact, like pydantic's model_dump_json. Key sets and order
follow vLLM 0.32.0 (tests/fixtures/vllm-0.32.0): `routed_experts` on every choice,
`completion_tokens_details` in usage, `ec_transfer_params` and `metrics` after
`kv_transfer_params`, chat's `prompt_text`, and a `system_fingerprint` string on bodies and on
the usage chunk, computed once at startup (`system_fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from narwhal.lab.engine.generator import Generator
from narwhal.lab.engine.tokenizer import Tokenizer

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


def body(obj: dict[str, Any]) -> bytes:
    return _dumps(obj).encode()


def usage(prompt: int, completion: int, details: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                           "completion_tokens": completion}
    if details:
        out["prompt_tokens_details"] = None
        out["completion_tokens_details"] = None
    return out


def system_fingerprint(version: str, tp: int, pp: int, dp: int, expert_parallel: bool,
                       config: str) -> str:
    """vLLM's default ("full") fingerprint: `vllm-<version>[-tpN][-ppN][-dpN][-ep]-<hash8>`.

    vLLM's hash8 is a digest of its whole VllmConfig, which the emulator does not have; here it
    is a digest of `config` (the settled launch plan), so it is stable for one plan and changes
    with it, which is all a client can rely on.
    """
    parts = [f"vllm-{version}"]
    parts += [f"{name}{size}" for name, size in (("tp", tp), ("pp", pp), ("dp", dp)) if size > 1]
    if expert_parallel:
        parts.append("ep")
    parts.append(hashlib.sha256(config.encode()).hexdigest()[:8])
    return "-".join(parts)


@dataclass(frozen=True)
class Head:
    """What every chunk and body of one response starts with."""

    request_id: str
    created: int
    model: str
    chat: bool
    fingerprint: str | None = None

    def start(self, stream: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if stream else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created,
                "model": self.model}


class LogprobWriter:
    """Deterministic fake logprobs in the completions or chat shape."""

    def __init__(self, tokenizer: Tokenizer, generator: Generator, states: list[int]) -> None:
        self._tok = tokenizer
        self._gen = generator
        self._states = states  # Planned.states: what each step drew from

    def completion(self, ids: Sequence[int], start: int, top: int,
                   text_offset: int) -> tuple[dict[str, Any], int]:
        """CompletionLogProbs for tokens [start, start+len(ids)); returns it and the new offset."""
        offsets, lps, tokens, tops = [], [], [], []
        for k, token in enumerate(ids):
            chosen, ranked = self._gen.logprobs(self._states[start + k], token, max(top, 1))
            text = self._tok.token_str(token)
            offsets.append(text_offset)
            text_offset += len(text)
            lps.append(chosen)
            tokens.append(text)
            tops.append({self._tok.token_str(t): lp for t, lp in ranked})
        return ({"text_offset": offsets, "token_logprobs": lps, "tokens": tokens,
                 "top_logprobs": tops}, text_offset)

    def chat(self, ids: Sequence[int], start: int, top: int) -> dict[str, Any]:
        content = []
        for k, token in enumerate(ids):
            chosen, ranked = self._gen.logprobs(self._states[start + k], token, top)
            text = self._tok.token_str(token)
            content.append({"token": text, "logprob": chosen, "bytes": list(text.encode()),
                            "top_logprobs": [
                                {"token": self._tok.token_str(t), "logprob": lp,
                                 "bytes": list(self._tok.token_str(t).encode())}
                                for t, lp in ranked]})
        return {"content": content}


def completion_body(head: Head, text: str, logprobs: dict[str, Any] | None, finish: str | None,
                    token_ids: list[int] | None, prompt_ids: list[int] | None, prompt_len: int,
                    completion_len: int, kv_params: dict[str, Any] | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
              "stop_reason": None, "token_ids": token_ids, "prompt_logprobs": None,
              "prompt_token_ids": prompt_ids, "routed_experts": None}
    return {**head.start(False), "choices": [choice], "service_tier": None,
            "system_fingerprint": head.fingerprint, "usage": usage(prompt_len, completion_len),
            "kv_transfer_params": kv_params, "ec_transfer_params": None, "metrics": None}


def chat_body(head: Head, role: str, text: str, logprobs: dict[str, Any] | None,
              finish: str | None, token_ids: list[int] | None, prompt_ids: list[int] | None,
              prompt_text: str | None, prompt_len: int, completion_len: int,
              kv_params: dict[str, Any] | None) -> dict[str, Any]:
    message = {"role": role, "content": text, "refusal": None, "annotations": None,
               "audio": None, "function_call": None, "reasoning": None}
    choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish,
              "stop_reason": None, "token_ids": token_ids, "routed_experts": None}
    return {**head.start(False), "choices": [choice], "service_tier": None,
            "system_fingerprint": head.fingerprint, "usage": usage(prompt_len, completion_len),
            "prompt_logprobs": None, "prompt_token_ids": prompt_ids, "prompt_text": prompt_text,
            "kv_transfer_params": kv_params, "ec_transfer_params": None, "metrics": None}


def completion_chunk(head: Head, text: str, logprobs: dict[str, Any] | None,
                     finish: str | None, token_ids: list[int] | None,
                     prompt_ids: list[int] | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
              "stop_reason": None, "prompt_token_ids": prompt_ids, "token_ids": token_ids}
    return {**head.start(True), "choices": [choice]}


def chat_role_chunk(head: Head, role: str, prompt_ids: list[int] | None,
                    prompt_text: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"role": role, "content": ""}, "logprobs": None,
              "finish_reason": None}
    return {**head.start(True), "choices": [choice], "prompt_token_ids": prompt_ids,
            "prompt_text": prompt_text}


def chat_chunk(head: Head, text: str, logprobs: dict[str, Any] | None, finish: str | None,
               token_ids: list[int] | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": logprobs,
                              "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = token_ids
    return {**head.start(True), "choices": [choice]}


def usage_chunk(head: Head, prompt_len: int, completion_len: int) -> dict[str, Any]:
    chunk = {**head.start(True), "choices": [], "usage": usage(prompt_len, completion_len, False)}
    if head.fingerprint is not None:
        chunk["system_fingerprint"] = head.fingerprint
    return chunk


def error_chunk(message: str, err_type: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}
