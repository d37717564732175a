"""What one canary probe of a pair says, from what came back and the consumer's counters.

A pure function of the answer and two counter readings, so every case is a unit test: the
probe passes only when the consumer answered 200 with the reference text (and, where the
reference has them, each token's logprob within the tolerance) and its own counter of prompt
tokens taken from a remote producer grew by the whole prompt. A consumer that recomputed the
prompt answers the same text: only its counters show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from narwhal.core.kv_canary import answer_logprobs, logprob_gap

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
        got = answer_logprobs(body)
        gap = "no logprobs came back" if got is None else \
            logprob_gap(ref.token_logprobs, got, tolerance)
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
    (summed over its label sets); None when the page has no such sample or does not parse."""
    try:
        samples = [sample for family in text_string_to_metric_families(
            metrics.decode("utf-8", "replace")) for sample in family.samples
            if sample.name == "vllm:prompt_tokens_by_source_total"
            and sample.labels.get("source") == "external_kv_transfer"]
    except ValueError:
        return None
    return sum(sample.value for sample in samples) if samples else None
