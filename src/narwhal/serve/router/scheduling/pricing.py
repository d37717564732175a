"""Pricing a placement on measured curves, relative to the SLO (pure arithmetic, no I/O).

The scheduler's questions, answered from an engine's bound profile row (generation.py makes
sure it is the live generation's row) and the work the router already sent it:
- prefill: predicted TTFT of an `n`-token prompt = seconds of prefill already queued on the
  engine + the prefill curve at `n`. Load is SLO-relative: queued seconds / TTFT budget.
  An engine batches every prefill waiting for its next step (vLLM's continuous batching, up to
  its token budget), so they all answer when that step ends: a newcomer delays each prefill
  already waiting behind the running step by its own cost. The placement is therefore priced
  by the worst TTFT in the batch it joins: the oldest waiting prefill's wait so far + the
  queue + the newcomer's curve (`batch_ttft_s`).
- decode: one step costs the decode curve at (resident tokens, running requests), plus, per
  decode leg arriving in that step, the cost of computing its last prompt token (a decode leg
  with pulled KV computes one token as a first prefill chunk: the prefill curve's constant).
  Arrivals per step are, in steady state, the sum of 1/max_tokens over the running streams.
  The request would see that step time as its TPOT, on average: arrivals land at random in a
  stream's life, so its own TPOT (the mean of its steps) strays from the mean step by about
  `arrival_s * sqrt(arrivals per step / its steps)` (`tpot_spread_s`: the arrivals in its life
  counted as Poisson). Admission holds the mean step plus `TPOT_SPREAD_Z` spreads to the
  budget; a placement judged on the mean alone sits at the ceiling, where half the streams
  land just past it (docs/router.md, "Admission", has what the decode-heavy bench showed).
  Load is SLO-relative: step time / TPOT budget. The impact of adding a request is the
  step-time increase it causes for everyone.
- the TTFT model's error: the router measures observed - predicted TTFT for each request
  that met no retry, as a moving mean and deviation (`ttft_error_seen`), and admission adds
  the mean and half a deviation to every prediction (`ttft_margin_s`): a model right on average
  still puts half of what it admits at the ceiling past it.
- the decode curve's bias: each stream that ends reports observed - predicted TPOT on its
  decode engine; the engine keeps their moving mean and admission adds it (`tpot_bias_s`) to
  the step it judges: a profile measured through a loaded client prices every step high and
  refuses streams the engine had room for (docs/router.md, "Each decode engine's measured
  bias").
- admission: if the best prefill placement misses the TTFT budget, or the best decode
  placement the TPOT budget, the request is refused; the TTFT refusal's `Retry-After` is the
  time until that engine's queue would let it meet the budget (whole seconds, at least 1).

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
    waited_s: float = 0.0  # how long the oldest prefill the newcomer would batch with has waited


@dataclass(frozen=True, slots=True)
class DecodeSeat(Generic[K]):
    """A decode candidate: its curve, what it decodes now and what arrivals cost it."""

    key: K
    curve: DecodeCurve
    resident_tokens: int
    running: int
    arrivals: float = 0.0  # decode legs arriving per step (sum of 1/max_tokens)
    arrival_s: float = 0.0  # what one arrival adds to its step (its prefill curve's constant)


def predicted_ttft_s(seat: PrefillSeat[K], prompt_tokens: int) -> float:
    return seat.queued_s + seat.curve.seconds(prompt_tokens)


def batch_ttft_s(seat: PrefillSeat[K], prompt_tokens: int) -> float:
    """The worst TTFT in the batch the prompt would join: the oldest waiting prefill's."""
    return seat.waited_s + predicted_ttft_s(seat, prompt_tokens)


def prefill_load(queued_s: float, ttft_budget_s: float) -> float:
    """Queued prefill work as a fraction of the TTFT budget (1.0: a new request just misses)."""
    return queued_s / ttft_budget_s


def predicted_tpot_s(seat: DecodeSeat[K], add_tokens: int = 0, add_requests: int = 0,
                     add_arrivals: float = 0.0) -> float:
    return (seat.curve.step_s(seat.resident_tokens + add_tokens, seat.running + add_requests)
            + seat.arrival_s * (seat.arrivals + add_arrivals))


# Spreads of a stream's own TPOT above the mean step that admission allows for. Half a
# spread: about seven streams in ten of those admitted at the ceiling keep the budget, and a
# wider hold admits fewer, which is work refused to save streams that miss by little
# (docs/router.md, "Admission", has the decode-heavy bench's counts for each hold).
TPOT_SPREAD_Z = 0.5


def tpot_spread_s(arrival_s: float, arrivals: float, steps: int | None) -> float:
    """How far one stream's TPOT strays from the mean step (one standard deviation): over its
    `steps` steps, `arrivals` per step land in its life as a Poisson count, each adding
    `arrival_s` to the step it lands in. 0 when its length or the arrivals are unknown, and
    for a single token, which has no gap between tokens to stray."""
    if not steps or steps < 2 or arrivals <= 0.0:
        return 0.0
    return arrival_s * math.sqrt(arrivals / steps)


# The TTFT prediction's own error, measured: every request that got its first token without a
# retry teaches the router how far the observed TTFT came from the one it was admitted on
# (a moving mean and mean deviation, weights as RFC 6298 keeps a round trip's). Admission holds
# the prediction plus the mean error plus `TTFT_ERROR_Z` deviations to the budget: a model
# right on average still sees half the requests admitted at the ceiling miss it, most of them
# by little. Half a deviation keeps nearly all of those within it; a whole one saves few more
# and refuses more (docs/router.md, "The TTFT model's measured error", has the prefill-heavy
# bench's counts).
TTFT_ERROR_WEIGHT = 0.125  # weight of the newest error in the mean (RFC 6298's alpha)
TTFT_DEV_WEIGHT = 0.25  # weight of the newest deviation (RFC 6298's beta)
TTFT_ERROR_Z = 0.5
TTFT_MARGIN_FLOOR = -0.25  # the margin never admits more than a quarter budget past the model
TTFT_MARGIN_CEILING = 0.5  # nor holds back more than half the budget


def ttft_error_seen(mean_s: float, dev_s: float, error_s: float) -> tuple[float, float]:
    """The moving (mean, mean deviation) of observed - predicted TTFT after one more error."""
    dev_s += TTFT_DEV_WEIGHT * (abs(error_s - mean_s) - dev_s)
    mean_s += TTFT_ERROR_WEIGHT * (error_s - mean_s)
    return mean_s, dev_s


def tpot_bias_s(error_s: float, tpot_budget_s: float) -> float:
    """A decode engine's measured curve bias as admission applies it: between a quarter budget
    less and half a budget more (the spread is modelled, `tpot_spread_s`; only the bias is
    learned)."""
    low = TTFT_MARGIN_FLOOR * tpot_budget_s
    high = TTFT_MARGIN_CEILING * tpot_budget_s
    return low if error_s < low else high if error_s > high else error_s


def ttft_margin_s(mean_s: float, dev_s: float, ttft_budget_s: float) -> float:
    """What admission adds to a predicted TTFT before holding it to the budget."""
    margin = mean_s + TTFT_ERROR_Z * dev_s
    low = TTFT_MARGIN_FLOOR * ttft_budget_s
    high = TTFT_MARGIN_CEILING * ttft_budget_s
    return low if margin < low else high if margin > high else margin


def arrivals_per_step(max_tokens: int | None) -> float:
    """A stream of `max_tokens` steps adds one arrival every that many steps (0: unknown)."""
    return 1.0 / max_tokens if max_tokens else 0.0


def decode_load(seat: DecodeSeat[K], tpot_budget_s: float) -> float:
    """Current step time as a fraction of the TPOT budget."""
    return predicted_tpot_s(seat) / tpot_budget_s


def decode_impact_s(seat: DecodeSeat[K], tokens: int, arrivals: float = 0.0) -> float:
    """How much one more request of `tokens` resident tokens slows every step on the engine."""
    return predicted_tpot_s(seat, tokens, 1, arrivals) - predicted_tpot_s(seat)


@dataclass(frozen=True, slots=True)
class Priced(Generic[K]):
    """The chosen engine, its prediction, and whether it meets the budget."""

    key: K
    predicted_s: float
    meets_budget: bool


def best_prefill(seats: Sequence[PrefillSeat[K]], prompt_tokens: int,
                 ttft_budget_s: float) -> Priced[K] | None:
    """The seat with the lowest worst-in-batch TTFT (`batch_ttft_s`; first one on ties)."""
    best: PrefillSeat[K] | None = None
    best_s = math.inf
    for seat in seats:
        t = batch_ttft_s(seat, prompt_tokens)
        if t < best_s:
            best, best_s = seat, t
    if best is None:
        return None
    return Priced(best.key, best_s, best_s <= ttft_budget_s)


def best_decode(seats: Sequence[DecodeSeat[K]], tokens: int, tpot_budget_s: float,
                arrivals: float = 0.0, steps: int | None = None) -> Priced[K] | None:
    """Among seats that keep the budget after adding the request (`tokens` resident, adding
    `arrivals` per step, for `steps` steps: its mean step plus `TPOT_SPREAD_Z` spreads), the
    one it slows least; if none can, the lowest resulting step."""
    best: DecodeSeat[K] | None = None
    best_rank = (True, math.inf)
    for seat in seats:
        after = predicted_tpot_s(seat, tokens, 1, arrivals)
        over = after + TPOT_SPREAD_Z * tpot_spread_s(
            seat.arrival_s, seat.arrivals + arrivals, steps) > tpot_budget_s
        rank = (over, after if over else decode_impact_s(seat, tokens, arrivals))
        if rank < best_rank:
            best, best_rank = seat, rank
    if best is None:
        return None
    return Priced(best.key, predicted_tpot_s(best, tokens, 1, arrivals), not best_rank[0])


def retry_after_s(predicted_ttft: float, ttft_budget_s: float) -> int:
    """Whole seconds until the queue ahead drains enough for the budget to be met (>= 1)."""
    return max(1, math.ceil(predicted_ttft - ttft_budget_s))
