"""`--calibrate-first-token`: directed first-token samples per pair and prompt length.

Pairs are measured in rounds that share no host (one at a time on a one-host fleet), each at
three prompt lengths up to the longest prompt every engine was profiled at (capped by
--calibrate-max-tokens), `repeats` fresh prompts each. The
candidate deadline is the worst pair-and-length p95 times a safety factor, rounded up to 0.1 s;
the rule is written in words into the document and printed, so the number can be re-derived.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from narwhal.core.calibration import SCHEMA, VERSION, Calibration, parse_calibration
from narwhal.serve.engine_client import EngineCallFailed, handoff
from narwhal.serve.preflight.kv_gate import DECODE_TOKENS
from narwhal.serve.preflight.options import CalibrateOptions
from narwhal.serve.preflight.pairs import all_pairs, in_rounds
from narwhal.serve.preflight.state import CheckState
from narwhal.serve.profiler.prompts import renewed, sized_prompt

MIN_TOKENS = 16
# A sized prompt lands within a few tokens of its target and a renewed nonce moves it by one;
# with the consumer's own tokens it must still fit the engine's context.
PROMPT_SLACK = 8


class CalibrationFailed(Exception):
    """A directed sample could not be taken; names the pair and what came back."""


def p95(samples: list[float]) -> float:
    """Nearest-rank 95th percentile (with 5 samples or fewer: the largest)."""
    ordered = sorted(samples)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


def lengths_for(state: CheckState, opts: CalibrateOptions) -> list[int]:
    """Prompt lengths up to the longest every engine was profiled at, less the consumer's
    tokens and the prompt's slack: a profile may reach the context's last token (max model
    length - 1), and a handoff there would be refused with a 400."""
    assert state.store is not None
    longest = min([r.prefill.max_prompt_tokens for r in state.store.profiles] + [opts.max_tokens])
    longest -= DECODE_TOKENS + PROMPT_SLACK
    return sorted({max(MIN_TOKENS, longest * k // opts.lengths) for k in range(1, opts.lengths + 1)})


def rule_text(opts: CalibrateOptions, pairs: int, lengths: list[int]) -> str:
    return (f"the largest, over {pairs} ordered pairs and prompt lengths {lengths} tokens, of the "
            f"nearest-rank p95 of {opts.repeats} first-token samples (producer leg plus the "
            f"consumer's first token), times safety factor {opts.safety_factor:g}, rounded up to "
            "0.1 s")


async def _samples(state: CheckState, producer: str, consumer: str, tokens: int,
                   repeats: int) -> tuple[int, list[float]]:
    p, c, model = state.clients[producer], state.clients[consumer], state.fleet.model
    text, got = await sized_prompt(p, model, tokens)
    out = []
    for _ in range(repeats):
        done = await handoff(p, c, model, renewed(text), DECODE_TOKENS)
        if done.decode is None or done.decode.status != 200:
            leg = done.decode or done.prefill
            raise CalibrationFailed(f"{producer}->{consumer} at {got} tokens: handoff answered "
                                    f"HTTP {leg.status}; run narwhal-check first")
        out.append(done.first_token_s)
    return got, out


async def _pair_rows(state: CheckState, producer: str, consumer: str, lengths: list[int],
                     repeats: int) -> list[dict[str, Any]]:
    """One pair's samples at every prompt length."""
    rows = []
    for tokens in lengths:
        try:
            got, samples = await _samples(state, producer, consumer, tokens, repeats)
        except EngineCallFailed as exc:
            raise CalibrationFailed(f"{producer}->{consumer}: {exc}") from None
        rows.append({"prompt_tokens": got, "samples_s": samples, "p95_s": p95(samples)})
    return rows


async def calibrate(state: CheckState, opts: CalibrateOptions) -> Calibration:
    """Sample every ordered pair and derive the candidate (state must have passed the gates)."""
    pairs = all_pairs(state.engines)
    lengths = lengths_for(state, opts)
    measured: list[dict[str, Any]] = []
    worst = 0.0
    # no two pairs of a round share a host: each is timed as it would be alone
    sampled = await in_rounds(state.engines, pairs,
                              lambda p, c: _pair_rows(state, p, c, lengths, opts.repeats))
    for (producer, consumer), rows in zip(pairs, sampled, strict=True):
        worst = max([worst, *(r["p95_s"] for r in rows)])
        measured.append({"producer": producer, "consumer": consumer, "lengths": rows})
    candidate = math.ceil(worst * opts.safety_factor * 10 - 1e-9) / 10
    document = {
        "schema": SCHEMA, "schema_version": VERSION, "model": state.fleet.model,
        "candidate_s": max(candidate, 0.1), "rule": rule_text(opts, len(pairs), lengths),
        "safety_factor": opts.safety_factor, "pairs": measured,
        "generations": [{"engine_id": eid, "generation": g.model_dump(mode="json")}
                        for eid, g in state.generations.items()],
        "measured_at": datetime.now(UTC).isoformat(),
    }
    return parse_calibration(document, "calibration being written")
