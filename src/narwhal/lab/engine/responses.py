"""Response bodies and SSE chunks, key for key as vLLM's OpenAI server writes them.

Non-streaming bodies list every field (vLLM dumps the whole model, nulls included); streamed
chunks list only the fields vLLM sets on them (it dumps with exclude_unset), and the final
usage chunk drops nulls. JSON is compact, like pydantic's model_dump_json.
"""

from __future__ import annotations

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
    return out


@dataclass(frozen=True)
class Head:
    """What every chunk and body of one response starts with."""

    request_id: str
    created: int
    model: str
    chat: bool

    def start(self, stream: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if stream else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created,
                "model": self.model}


class LogprobWriter:
    """Deterministic fake logprobs in the completions or chat shape."""

    def __init__(self, tokenizer: Tokenizer, generator: Generator, seed: int) -> None:
        self._tok = tokenizer
        self._gen = generator
        self._seed = seed

    def completion(self, ids: Sequence[int], start: int, top: int,
                   text_offset: int) -> tuple[dict[str, Any], int]:
        """CompletionLogProbs for tokens [start, start+len(ids)); returns it and the new offset."""
        offsets, lps, tokens, tops = [], [], [], []
        for k, token in enumerate(ids):
            chosen, ranked = self._gen.logprobs(self._seed, start + k, token, max(top, 1))
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
            chosen, ranked = self._gen.logprobs(self._seed, start + k, token, top)
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
              "prompt_token_ids": prompt_ids}
    return {**head.start(False), "choices": [choice], "service_tier": None,
            "system_fingerprint": None, "usage": usage(prompt_len, completion_len),
            "kv_transfer_params": kv_params}


def chat_body(head: Head, role: str, text: str, logprobs: dict[str, Any] | None,
              finish: str | None, token_ids: list[int] | None, prompt_ids: list[int] | None,
              prompt_len: int, completion_len: int,
              kv_params: dict[str, Any] | None) -> dict[str, Any]:
    message = {"role": role, "content": text, "refusal": None, "annotations": None,
               "audio": None, "function_call": None, "reasoning": None}
    choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish,
              "stop_reason": None, "token_ids": token_ids}
    return {**head.start(False), "choices": [choice], "service_tier": None,
            "system_fingerprint": None, "usage": usage(prompt_len, completion_len),
            "prompt_logprobs": None, "prompt_token_ids": prompt_ids,
            "kv_transfer_params": kv_params}


def completion_chunk(head: Head, text: str, logprobs: dict[str, Any] | None,
                     finish: str | None, token_ids: list[int] | None,
                     prompt_ids: list[int] | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
              "stop_reason": None, "prompt_token_ids": prompt_ids, "token_ids": token_ids}
    return {**head.start(True), "choices": [choice]}


def chat_role_chunk(head: Head, role: str, prompt_ids: list[int] | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"role": role, "content": ""}, "logprobs": None,
              "finish_reason": None}
    return {**head.start(True), "choices": [choice], "prompt_token_ids": prompt_ids}


def chat_chunk(head: Head, text: str, logprobs: dict[str, Any] | None, finish: str | None,
               token_ids: list[int] | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": logprobs,
                              "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = token_ids
    return {**head.start(True), "choices": [choice]}


def usage_chunk(head: Head, prompt_len: int, completion_len: int) -> dict[str, Any]:
    return {**head.start(True), "choices": [], "usage": usage(prompt_len, completion_len, False)}


def error_chunk(message: str, err_type: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}
