"""Pool planner: how many `both` engines should prefill, sized from the demand of a recent window.

The reactive controller (roles.py, mode `reactive`) moves an engine when one pool is already
over its budget; by then requests have queued. The planner (mode `planner`) instead measures
what the fleet is being asked to do over the last `window_s` seconds and sizes both pools for
it, so a shift in the mix moves engines as soon as the window shows it:

- prefill demand: seconds of prefill work offered per second, priced on the profiled curves,
  counting requests admission refused (they are demand the prefill pool did not serve, and
  leaving them out would shrink the pool exactly when it is too small);
- decode demand: the mean number of decode streams, their resident tokens and the decode legs
  landing per step (the sum of 1/max_tokens over the streams) over the window, plus what the
  streams admission refused on TPOT would have added (by Little's law, the rate of their
  stream-seconds at the budget), for the same reason.

The split is chosen for the requests it serves. For each candidate split the planner estimates
the share of the offered requests each pool would refuse. When every split refuses some, it
takes the one that refuses least; when some split has room, it takes, among the splits that
refuse alike, the one whose more loaded pool is least loaded (below), so a fleet with room to
spare keeps that room where bursts need it. Either way the current split stays unless a move
clearly gains (`plan_prefill`).

- A prefill pool of `n` engines refuses what its queue cannot hold within the TTFT budget.
  `prefill_loss` is the diffusion estimate of a queue with a bounded wait: utilisation
  `rho = rate / n`, a wait that may hold `n * (ttft - S) / S` service times `S` (the pool's
  engines share one queue in effect, since each request goes to the shortest), arrivals
  Poisson and service times of squared coefficient of variation `PREFILL_SERVICE_CV2`.
- A decode pool of `n` engines runs what the prefill pool admits (the window counts every
  offered request's decode work, refused or not, as demand) and refuses a stream when the
  streams already there would push the step admission judges past the budget: it holds
  `n * (tpot - base - bias - spread) / k` streams, `k` being one stream's share of a step (its
  per-request term, its resident tokens, its landing leg once per its length). The streams it would run follow from Little's law at
  that pool's own step (tokens asked for per second, measured at the current split, times the
  step the candidate gives), and their count varies as a Poisson count plus the requests in
  prefill (admission counts those reserved on their decode engine). `decode_loss` is the
  chance that count reaches the capacity. Sized on the curve alone, a pool of short streams
  looks lighter than admission finds it: each short stream lands its leg (the prefill curve's
  constant) once in its few steps, a share of every step the decode curve does not hold
  (docs/router.md, "The planner", has the prefill-heavy phase's figures).

The old rule alone, every spare engine to the pool loaded more against its utilisation target
(`rate / (n * prefill_utilization)` for prefill, the judged step over `decode_utilization *
tpot` for decode), equalises loads but not refusals: in the goodput bench's prefill-heavy phase
the uneven split it chose refused more requests, all on TPOT, than an even one (docs/router.md,
"Why refusals and not loads alone"). Near a pool's limit a prefill queue whose TTFT budget
holds several prefills absorbs a small overload; a decode engine holding a handful of short
streams does not. The loads still decide between splits whose refusals are alike, which is
every split when the fleet has room to spare.

Pure functions over plain numbers: the controller samples, this decides, tests check both.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

from narwhal.core.profiles import DecodeCurve
from narwhal.serve.router.scheduling.pricing import TPOT_SPREAD_Z, tpot_spread_s


@dataclass(frozen=True, slots=True)
class Demand:
    """What the window saw: prefill seconds offered per second, mean streams, their tokens and
    the decode legs landing per step."""

    prefill_rate: float
    streams: float
    resident_tokens: float
    arrivals: float = 0.0
    requests: float = 0.0  # offered per second, admitted or refused (0: not measured)


@dataclass(frozen=True, slots=True)
class StepCost:
    """What a decode step costs beyond the curve, as admission prices it: each landing leg's
    `arrival_s` and the decode engines' learned `bias_s` (observed - predicted TPOT)."""

    arrival_s: float = 0.0
    bias_s: float = 0.0


NO_EXTRA = StepCost()


@dataclass(frozen=True, slots=True)
class PoolShape:
    """Engines the planner does not move (fixed roles) and the floors of the movable ones."""

    movable: int
    fixed_prefill: int
    fixed_decode: int
    min_prefill: int
    min_decode: int


def prefill_pool_load(demand: Demand, engines: int, utilization: float) -> float:
    if engines <= 0:
        return math.inf if demand.prefill_rate > 0 else 0.0
    return demand.prefill_rate / (engines * utilization)


def spread_step_s(curve: DecodeCurve, resident_tokens: float, streams: float, engines: int) -> float:
    """The decode step with `streams` and their `resident_tokens` spread evenly over `engines`
    (the per-request term kept fractional: 3 streams on 2 engines are 1.5 each)."""
    return curve.step_s(round(resident_tokens / engines), 0) + curve.per_request_s * streams / engines


# Demand below this (seconds of prefill, streams, legs per step) is none: the window's rates
# are differences of floats, and a rate of 1e-300 would divide into infinity.
NEGLIGIBLE = 1e-9


def _typical_steps(demand: Demand) -> int | None:
    """A stream's typical length in steps: streams over the legs they land per step."""
    if demand.arrivals <= NEGLIGIBLE:
        return None
    return round(min(demand.streams / demand.arrivals, 1e9))


def judged_step_s(demand: Demand, engines: int, curve: DecodeCurve, cost: StepCost) -> float:
    """The step admission would judge with the demand spread evenly over `engines`: the curve,
    the landing legs, the bias, and `TPOT_SPREAD_Z` spreads of a stream of the typical length."""
    arrivals = demand.arrivals / engines
    return (spread_step_s(curve, demand.resident_tokens, demand.streams, engines)
            + cost.arrival_s * arrivals + cost.bias_s
            + TPOT_SPREAD_Z * tpot_spread_s(cost.arrival_s, arrivals, _typical_steps(demand)))


def decode_pool_load(demand: Demand, engines: int, curve: DecodeCurve, tpot_s: float,
                     utilization: float, cost: StepCost = NO_EXTRA) -> float:
    if engines <= 0:
        return math.inf if demand.streams > 0 else 0.0
    return judged_step_s(demand, engines, curve, cost) / (utilization * tpot_s)


# Squared coefficient of variation of prefill service times: between a fixed prompt length (0)
# and exponential ones (1); a mix of short and long prompts sits half way (docs/router.md,
# "The planner").
PREFILL_SERVICE_CV2 = 0.5
# Splits whose estimated refusals are within this share of the offered requests of the best
# are alike; the loads choose among them.
LOSS_TIE = 0.01


def prefill_loss(demand: Demand, engines: int, ttft_s: float) -> float:
    """Share of the offered requests a prefill pool of `engines` would refuse on TTFT (see the
    module doc). Without a measured request rate only an overload counts: 1 - 1/rho."""
    rate = demand.prefill_rate
    if rate <= NEGLIGIBLE:
        return 0.0
    if engines <= 0:
        return 1.0
    rho = rate / engines
    if demand.requests <= NEGLIGIBLE:
        return max(0.0, 1.0 - 1.0 / rho)
    service = rate / demand.requests
    if service <= NEGLIGIBLE:
        return 0.0  # prefills that cost nothing never wait
    room = ttft_s - service
    if room <= 0.0:
        return 1.0
    hold = engines * room / service  # the wait the budget allows, in service times
    drift = rho - 1.0
    spread = rho * (1.0 + PREFILL_SERVICE_CV2)
    x = 2.0 * drift * hold / spread
    if abs(x) < 1e-9:
        lost = spread / (2.0 * hold)
    elif x < -700.0:
        return 0.0
    else:
        lost = drift / -math.expm1(-x)  # work pushed past the bound, per unit time
    return min(1.0, lost / rho)


def in_prefill(demand: Demand, engines: int, ttft_s: float) -> float:
    """Requests a prefill pool of `engines` holds on average, waiting or in service: the
    arrival rate times the time in the pool (the Pollaczek-Khinchine wait of one engine at the
    pool's utilisation, never past what the TTFT budget lets admission queue)."""
    if demand.requests <= NEGLIGIBLE or demand.prefill_rate <= NEGLIGIBLE or engines <= 0:
        return 0.0
    service = demand.prefill_rate / demand.requests
    rho = demand.prefill_rate / engines
    longest = max(0.0, ttft_s - service)
    wait = (longest if rho >= 1.0 else
            min(longest, rho * service * (1.0 + PREFILL_SERVICE_CV2) / (2.0 * (1.0 - rho))))
    return demand.requests * (wait + service)


def decode_loss(demand: Demand, engines: int, curve: DecodeCurve, tpot_s: float,
                cost: StepCost = NO_EXTRA, decoding_now: int = 0,
                prefilling: float = 0.0) -> float:
    """Share of the offered streams a decode pool of `engines` would refuse on TPOT (see the
    module doc). `decoding_now`: the engines the window's streams ran on (0: take the streams
    as measured, without solving for the candidate's step). `prefilling`: requests in the
    prefill pool (`in_prefill`); admission counts them on their decode engine less the ones
    it expects to end meanwhile, so their number varies the count it judges."""
    n = demand.streams
    if n <= NEGLIGIBLE:
        return 0.0
    if engines <= 0:
        return 1.0
    share = (curve.per_request_s + curve.per_token_s * demand.resident_tokens / n
             + cost.arrival_s * demand.arrivals / n)
    fixed = max(0.0, curve.base_s + cost.bias_s)  # a learned bias never makes a step free
    room = tpot_s - fixed - TPOT_SPREAD_Z * tpot_spread_s(
        cost.arrival_s, demand.arrivals / engines, _typical_steps(demand))
    if room <= 0.0:
        return 1.0
    if share <= 0.0:
        return 0.0
    capacity = engines * room / share
    streams = n
    if decoding_now > 0:
        tokens_per_s = n / (fixed + share * n / decoding_now)
        busy = tokens_per_s * share / engines
        if busy >= 1.0:
            return 1.0  # the streams would outgrow any step
        streams = tokens_per_s * fixed / (1.0 - busy)
    spread = math.sqrt(streams + prefilling)
    if spread <= 0.0:
        return 0.0  # no stream to count
    return 0.5 * math.erfc((capacity - streams) / (spread * math.sqrt(2.0)))


@dataclass(frozen=True, slots=True)
class Sizing:
    """What the pools are sized against: the decode curve, the SLO, the step's extra cost, the
    utilisation targets, and how many engines decoded while the window was measured."""

    curve: DecodeCurve
    ttft_s: float
    tpot_s: float
    prefill_utilization: float
    decode_utilization: float
    cost: StepCost = NO_EXTRA
    decoding_now: int = 0


@dataclass(frozen=True, slots=True)
class Split:
    """One candidate split and what the planner estimated for it."""

    prefill: int  # movable engines that prefill
    loss: float  # share of the offered requests refused, both pools together
    prefill_load: float
    decode_load: float


def candidates(demand: Demand, shape: PoolShape, sizing: Sizing) -> list[Split]:
    """Every split the floors allow, with its estimated refusals and loads."""
    out = []
    for n_prefill in range(shape.min_prefill, shape.movable - shape.min_decode + 1):
        prefill = shape.fixed_prefill + n_prefill
        decode = shape.fixed_decode + shape.movable - n_prefill
        p_loss = prefill_loss(demand, prefill, sizing.ttft_s)
        # The decode pool runs only what the prefill pool admits.
        passed = 1.0 - p_loss
        admitted = replace(demand, streams=demand.streams * passed,
                           resident_tokens=demand.resident_tokens * passed,
                           arrivals=demand.arrivals * passed)
        d_loss = decode_loss(admitted, decode, sizing.curve, sizing.tpot_s, sizing.cost,
                             sizing.decoding_now,
                             in_prefill(demand, prefill, sizing.ttft_s) * passed)
        out.append(Split(n_prefill, 1.0 - (1.0 - p_loss) * (1.0 - d_loss),
                         prefill_pool_load(demand, prefill, sizing.prefill_utilization),
                         decode_pool_load(demand, decode, sizing.curve, sizing.tpot_s,
                                          sizing.decode_utilization, sizing.cost)))
    return out


def plan_prefill(demand: Demand, shape: PoolShape, sizing: Sizing,
                 current: int | None = None) -> int:
    """How many movable engines should prefill (the rest decode), given `current` of them
    prefill now.

    When every split refuses (the least estimate above `LOSS_TIE`), the one that refuses
    least; the current split stays unless another refuses `LOSS_TIE` less (the estimates near
    a tie swing with the window, and each move drains an engine's streams). When some split
    has room, among the splits that refuse alike (within `LOSS_TIE` of the least) the current
    one stays while both its pools are within their targets (loads at most 1); else the one
    whose more loaded pool is least loaded, then the one with fewer prefill engines."""
    splits = candidates(demand, shape, sizing)
    least = min(s.loss for s in splits)
    now = next((s for s in splits if s.prefill == current), None)
    if least > LOSS_TIE:
        if now is not None and now.loss <= least + LOSS_TIE:
            return now.prefill
        return min(splits, key=lambda s: (s.loss, s.prefill)).prefill
    alike = [s for s in splits if s.loss <= least + LOSS_TIE]
    if now in alike and max(now.prefill_load, now.decode_load) <= 1.0:
        return now.prefill
    return min(alike, key=lambda s: (max(s.prefill_load, s.decode_load), s.prefill)).prefill


@dataclass(frozen=True, slots=True)
class Refused:
    """Cumulative decode work admission refused on TPOT, as the streams would have held it:
    stream-seconds, resident-token-seconds and landing-legs-per-step-seconds (a refused stream
    of `k` steps lands one leg per `k` steps for `k` steps of the budget: one budget's worth)."""

    stream_s: float = 0.0
    token_s: float = 0.0
    arrival_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One tick's reading. `offered_*` and `refused` are cumulative counters; the rest is what
    runs at that instant (streams, their resident tokens, the legs they land per step)."""

    at: float
    offered_prefill_s: float
    streams: int
    resident_tokens: int
    arrivals: float = 0.0
    offered_requests: int = 0
    refused: Refused = Refused()


class DemandWindow:
    """The samples of the last `window_s` seconds and the demand they show."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)
        while self._samples and sample.at - self._samples[0].at > self.window_s:
            self._samples.popleft()

    def demand(self) -> Demand | None:
        """None until the window holds two samples at least half a window apart."""
        samples = self._samples
        if len(samples) < 2:
            return None
        first, last = samples[0], samples[-1]
        span = last.at - first.at
        if span < self.window_s / 2:
            return None
        n = len(samples)
        r0, r1 = first.refused, last.refused
        return Demand(
            prefill_rate=(last.offered_prefill_s - first.offered_prefill_s) / span,
            streams=sum(s.streams for s in samples) / n + (r1.stream_s - r0.stream_s) / span,
            resident_tokens=(sum(s.resident_tokens for s in samples) / n
                             + (r1.token_s - r0.token_s) / span),
            arrivals=sum(s.arrivals for s in samples) / n + (r1.arrival_s - r0.arrival_s) / span,
            requests=(last.offered_requests - first.offered_requests) / span)
