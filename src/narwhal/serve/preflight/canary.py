"""Recording the live KV canary's reference (`narwhal.kv-canary`), with the calibration.

One fixed prompt, a few KV blocks long, goes through every ordered pair as the router will
send it: a one-token prefill on the producer that keeps the KV, then a greedy decode with
logprobs on the consumer with the producer's params, each probe under a fresh `cache_salt` so
that no prefix cache answers for the KV. Every pair must answer the same text and, token by
token, the same logprobs (within the tolerance the router will hold them to), or recording
fails naming the pairs that differ: a fleet whose pairs disagree at preflight has a handoff
that is wrong already. The kv gate, run before, proved each pair's consumer pulled the KV.
"""

from __future__ import annotations

import math
import secrets
from datetime import UTC, datetime
from typing import Any

from narwhal.core.kv_canary import (
    LOGPROB_TOLERANCE,
    SCHEMA,
    VERSION,
    KvCanary,
    answer_logprobs,
    logprob_gap,
    parse_canary,
)
from narwhal.serve.engine_client import PRODUCER_PARAMS, Completion, EngineClient
from narwhal.serve.preflight.pairs import all_pairs, in_rounds
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.profiler.prompts import sized_prompt

PROMPT_TOKENS = 96  # several KV blocks at any block size vLLM uses on a GPU or CPU
ANSWER_TOKENS = 8


class CanaryFailed(Exception):
    """A pair could not be probed, or the pairs disagree; names them."""


def _logprobs(done: Completion) -> list[float | None] | None:
    got = answer_logprobs(done.body)
    return None if got is None else [
        float(v) if isinstance(v, int | float) and math.isfinite(v) else None for v in got]


async def _probe(producer: EngineClient, consumer: EngineClient, model: str,
                 prompt: str) -> tuple[Completion, float]:
    salt = {"cache_salt": f"narwhal-canary-{secrets.token_hex(8)}", "ignore_eos": True}
    first = await producer.complete(model, prompt, 1, kv_transfer_params=PRODUCER_PARAMS,
                                    extra=salt)
    params = first.kv_transfer_params
    if first.status != 200 or params is None:
        raise CanaryFailed(f"{producer.id}->{consumer.id}: the producer answered HTTP "
                           f"{first.status} without kv_transfer_params")
    second = await consumer.complete(model, prompt, ANSWER_TOKENS, kv_transfer_params=params,
                                     extra={**salt, "logprobs": 1})
    if second.status != 200:
        raise CanaryFailed(f"{producer.id}->{consumer.id}: the consumer answered HTTP "
                           f"{second.status}")
    return second, first.total_s + second.first_token_s


def _disagree(want: list[float | None] | None, got: list[float | None] | None) -> bool:
    if want is None or got is None:
        return want is not got
    return bool(logprob_gap(want, got, LOGPROB_TOLERANCE))


async def record_canary(state: CheckState) -> KvCanary | None:
    """The reference every pair gave (None: a fleet with no pair to probe)."""
    pairs = all_pairs(state.engines)
    if not pairs:
        return None
    model = state.fleet.model
    prompt, tokens = await sized_prompt(state.clients[pairs[0][0]], model, PROMPT_TOKENS)
    probes = await in_rounds(state.engines, pairs, lambda p, c: _probe(
        state.clients[p], state.clients[c], model, prompt))
    answers = [(p, c, *got) for (p, c), got in zip(pairs, probes, strict=True)]
    _, _, first, _ = answers[0]
    want = _logprobs(first)
    differ = [f"{p}->{c} answered {d.text[:60]!r}" for p, c, d, _ in answers
              if d.text != first.text or _disagree(want, _logprobs(d))]
    if differ:
        raise CanaryFailed(f"the pairs disagree on the canary's answer ({pairs[0][0]}->"
                           f"{pairs[0][1]} answered {first.text[:60]!r}): " + "; ".join(differ))
    document: dict[str, Any] = {
        "schema": SCHEMA, "schema_version": VERSION, "model": model, "prompt": prompt,
        "prompt_tokens": tokens, "max_tokens": ANSWER_TOKENS, "text": first.text,
        "token_logprobs": want,
        "pairs": [{"producer": p, "consumer": c, "first_token_s": round(s, 6)}
                  for p, c, _, s in answers],
        "measured_at": datetime.now(UTC).isoformat()}
    return parse_canary(document, "kv canary being written")
