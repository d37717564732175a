"""Pool planner: how many `both` engines should prefill, sized from the demand of a recent window.

The reactive controller (roles.py, mode `reactive`) moves an engine when one pool is already
over its budget; by then requests have queued. The planner (mode `planner`) instead measures
what the fleet is being asked to do over the last `window_s` seconds and sizes both pools for
it, so a shift in the mix moves engines as soon as the window shows it:

- prefill demand: seconds of prefill work offered per second, priced on the profiled curves,
  counting requests admission refused (they are demand the prefill pool did not serve, and
  leaving them out would shrink the pool exactly when it is too small);
- decode demand: the mean number of decode streams and their resident tokens over the window,
  plus the streams admission refused on TPOT would have added (by Little's law, the rate of
  their stream-seconds at the budget), for the same reason.

A prefill pool of `n` engines is loaded `rate / (n * prefill_utilization)`: keeping each
engine's busy share below the target keeps queueing, and so TTFT, bounded. A decode pool of `n`
engines is loaded `step(N/n, R/n) / (decode_utilization * tpot)`: the step time with the
streams spread evenly, against the share of the TPOT budget a step may use. Starting from the
floors, each remaining engine goes to whichever pool is more loaded; that equalises the two
loads and, when the fleet is big enough, brings both under 1.

Pure functions over plain numbers: the controller samples, this decides, tests check both.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from narwhal.core.profiles import DecodeCurve


@dataclass(frozen=True, slots=True)
class Demand:
    """What the window saw: prefill seconds offered per second, mean streams and tokens."""

    prefill_rate: float
    streams: float
    resident_tokens: float


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


def decode_pool_load(demand: Demand, engines: int, curve: DecodeCurve, tpot_s: float,
                     utilization: float) -> float:
    if engines <= 0:
        return math.inf if demand.streams > 0 else 0.0
    return spread_step_s(curve, demand.resident_tokens, demand.streams, engines) / (utilization * tpot_s)


def plan_prefill(demand: Demand, shape: PoolShape, curve: DecodeCurve, tpot_s: float,
                 prefill_utilization: float, decode_utilization: float) -> int:
    """How many movable engines should prefill (the rest decode)."""
    n_prefill, n_decode = shape.min_prefill, shape.min_decode
    for _ in range(shape.movable - n_prefill - n_decode):
        p = prefill_pool_load(demand, shape.fixed_prefill + n_prefill, prefill_utilization)
        d = decode_pool_load(demand, shape.fixed_decode + n_decode, curve, tpot_s,
                             decode_utilization)
        if p > d:
            n_prefill += 1
        else:
            n_decode += 1
    return n_prefill


class DemandWindow:
    """Samples of (time, cumulative offered prefill seconds, streams, resident tokens,
    cumulative refused stream-seconds, cumulative refused resident-token-seconds)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float, int, int, float, float]] = deque()

    def add(self, now: float, offered_prefill_s: float, streams: int, resident_tokens: int,
            refused_stream_s: float = 0.0, refused_token_s: float = 0.0) -> None:
        self._samples.append((now, offered_prefill_s, streams, resident_tokens, refused_stream_s,
                              refused_token_s))
        while self._samples and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    def demand(self) -> Demand | None:
        """None until the window holds two samples at least half a window apart."""
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        span = last[0] - first[0]
        if span < self.window_s / 2:
            return None
        n = len(self._samples)
        return Demand((last[1] - first[1]) / span,
                      sum(s[2] for s in self._samples) / n + (last[4] - first[4]) / span,
                      sum(s[3] for s in self._samples) / n + (last[5] - first[5]) / span)
