"""Pricing a placement on measured curves, relative to the SLO (pure arithmetic, no I/O).

The scheduler's questions, answered from an engine's bound profile row (generation.py makes
sure it is the live generation's row) and the work the router already sent it:
- prefill: predicted TTFT of an `n`-token prompt = seconds of prefill already queued on the
  engine + the prefill curve at `n`. Load is SLO-relative: queued seconds / TTFT budget.
- decode: one step costs the decode curve at (resident tokens, running requests); the request
  would see that step time as its TPOT. Load is SLO-relative: step time / TPOT budget. The
  impact of adding a request is the step-time increase it causes for everyone on the engine.
- admission: if the best prefill placement misses the TTFT budget, the request is refused
  with a `Retry-After` priced as the time until that engine's queue would let it meet the
  budget (rounded up to whole seconds, at least 1).

Nothing here allocates per engine on the request path beyond one tuple per candidate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from narwhal.core.profiles import DecodeCurve, PrefillCurve

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class PrefillSeat(Generic[K]):
    """A prefill candidate: the engine (any key), its curve and the prefill seconds queued."""

    key: K
    curve: PrefillCurve
    queued_s: float


@dataclass(frozen=True, slots=True)
class DecodeSeat(Generic[K]):
    """A decode candidate: its curve and what it decodes now."""

    key: K
    curve: DecodeCurve
    resident_tokens: int
    running: int


def predicted_ttft_s(seat: PrefillSeat[K], prompt_tokens: int) -> float:
    return seat.queued_s + seat.curve.seconds(prompt_tokens)


def prefill_load(queued_s: float, ttft_budget_s: float) -> float:
    """Queued prefill work as a fraction of the TTFT budget (1.0: a new request just misses)."""
    return queued_s / ttft_budget_s


def predicted_tpot_s(seat: DecodeSeat[K], add_tokens: int = 0, add_requests: int = 0) -> float:
    return seat.curve.step_s(seat.resident_tokens + add_tokens, seat.running + add_requests)


def decode_load(seat: DecodeSeat[K], tpot_budget_s: float) -> float:
    """Current step time as a fraction of the TPOT budget."""
    return predicted_tpot_s(seat) / tpot_budget_s


def decode_impact_s(seat: DecodeSeat[K], tokens: int) -> float:
    """How much one more request of `tokens` resident tokens slows every step on the engine."""
    return predicted_tpot_s(seat, tokens, 1) - predicted_tpot_s(seat)


@dataclass(frozen=True, slots=True)
class Priced(Generic[K]):
    """The chosen engine, its prediction, and whether it meets the budget."""

    key: K
    predicted_s: float
    meets_budget: bool


def best_prefill(seats: Sequence[PrefillSeat[K]], prompt_tokens: int,
                 ttft_budget_s: float) -> Priced[K] | None:
    """The seat with the lowest predicted TTFT (first one on ties)."""
    best: PrefillSeat[K] | None = None
    best_s = math.inf
    for seat in seats:
        t = predicted_ttft_s(seat, prompt_tokens)
        if t < best_s:
            best, best_s = seat, t
    if best is None:
        return None
    return Priced(best.key, best_s, best_s <= ttft_budget_s)


def best_decode(seats: Sequence[DecodeSeat[K]], tokens: int,
                tpot_budget_s: float) -> Priced[K] | None:
    """Among seats that keep the budget after adding the request, the one it slows least;
    if none can, the one with the lowest resulting step time."""
    best: DecodeSeat[K] | None = None
    best_rank = (True, math.inf)
    for seat in seats:
        after = predicted_tpot_s(seat, tokens, 1)
        rank = (after > tpot_budget_s, decode_impact_s(seat, tokens) if after <= tpot_budget_s else after)
        if rank < best_rank:
            best, best_rank = seat, rank
    if best is None:
        return None
    after = predicted_tpot_s(best, tokens, 1)
    return Priced(best.key, after, after <= tpot_budget_s)


def retry_after_s(predicted_ttft: float, ttft_budget_s: float) -> int:
    """Whole seconds until the queue ahead drains enough for the budget to be met (>= 1)."""
    return max(1, math.ceil(predicted_ttft - ttft_budget_s))
