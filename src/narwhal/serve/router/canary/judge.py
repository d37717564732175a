"""What one canary probe of a pair says, from what came back and the consumer's counters.

A pure function of the answer and two counter readings, so every case is a unit test: the
probe passes only when the consumer answered 200 with the reference text (and, where the
reference has them, each token's logprob within the tolerance) and its own counter of prompt
tokens taken from a remote producer grew by the whole prompt. A consumer that recomputed the
prompt answers the same text: only its counters show it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

OK = "ok"
MISMATCH = "mismatch"  # HTTP 200 with another answer: the KV it decoded was not the prompt's
RECOMPUTED = "recomputed"  # the answer is right but the consumer computed the prompt itself
FAILED = "failed"  # a leg failed, answered another status, or gave no KV to pull
VERDICTS = (OK, MISMATCH, RECOMPUTED, FAILED)


@dataclass(frozen=True)
class Verdict:
    kind: str
    detail: str  # the evidence, in words

    @property
    def ok(self) -> bool:
        return self.kind == OK


@dataclass(frozen=True)
class Reference:
    """The answer every pair gave at preflight (core/kv_canary.py), as the router probes."""

    prompt: str
    prompt_tokens: int
    max_tokens: int
    text: str
    token_logprobs: tuple[float | None, ...] | None


def _logprobs(body: dict[str, Any]) -> list[Any] | None:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    logprobs = choices[0].get("logprobs")
    got = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    return got if isinstance(got, list) else None


def _logprob_gap(want: tuple[float | None, ...], got: list[Any], tolerance: float) -> str:
    if len(got) != len(want):
        return f"{len(got)} logprobs came back, the reference has {len(want)}"
    for k, (w, g) in enumerate(zip(want, got, strict=True)):
        if w is None or g is None:
            continue
        if not isinstance(g, int | float) or not math.isfinite(g) or abs(g - w) > tolerance:
            return f"token {k}'s logprob is {g!r}, the reference {w!r} (tolerance {tolerance:g})"
    return ""


def judge(ref: Reference, status: int, body: dict[str, Any], external_tokens: float | None,
          tolerance: float) -> Verdict:
    """The verdict on a probe whose decode leg answered `status` with `body`, the consumer's
    external-KV counter having grown by `external_tokens` (None: it could not be read)."""
    if status != 200:
        error = body.get("error")
        said = error.get("message") if isinstance(error, dict) else error
        return Verdict(FAILED, f"the consumer answered HTTP {status}: {str(said)[:200]}")
    choices = body.get("choices")
    text = choices[0].get("text") if isinstance(choices, list) and choices \
        and isinstance(choices[0], dict) else None
    if not isinstance(text, str):
        return Verdict(MISMATCH, "answered no completion text")
    if text != ref.text:
        return Verdict(MISMATCH, f"answered {text[:120]!r}, the reference is {ref.text[:120]!r}")
    if ref.token_logprobs is not None:
        got = _logprobs(body)
        gap = "no logprobs came back" if got is None else \
            _logprob_gap(ref.token_logprobs, got, tolerance)
        if gap:
            return Verdict(MISMATCH, gap)
    if external_tokens is None:
        return Verdict(FAILED, "the consumer's /metrics has no external KV counter "
                               "(vllm:prompt_tokens_by_source_total)")
    if external_tokens < ref.prompt_tokens:
        return Verdict(RECOMPUTED, f"the consumer took {external_tokens:g} of the prompt's "
                                   f"{ref.prompt_tokens} tokens from the producer and computed "
                                   "the rest itself")
    return Verdict(OK, f"{ref.prompt_tokens} prompt tokens pulled, the reference answer")


def external_kv_tokens(metrics: bytes) -> float | None:
    """The consumer's `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`
    (summed over its label sets); None when the page has no such sample."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        if line.startswith(b"vllm:prompt_tokens_by_source_total{") \
                and b'source="external_kv_transfer"' in line:
            try:
                total += float(line.rsplit(b" ", 1)[1])
            except (ValueError, IndexError):
                return None
            seen = True
    return total if seen else None
