"""Reactive role flips: `both` engines move between the prefill and decode pools as load shifts.

A kv_both engine serves either leg without a restart, so the split of the `both` engines
between a prefill pool and a decode pool is a router decision. Each such engine holds one
current role; a controller task, off the request path, looks at both pools every
`role_flips.interval_s` and moves at most one engine:

- prefill load: the predicted TTFT of the next request at its best prefill engine, taken from
  the scheduler's queue model (queued seconds + the curve's fixed cost), over `slo.ttft_s`;
- decode load: the worst predicted decode step time among the decode engines (the curve at
  the streams this router runs there) as a share of the headroom its curve leaves under
  `slo.tpot_s`: `(step - base) / (tpot - base)`, 0 when idle, 1 at the budget. (A raw
  `step / tpot` never falls below `base / tpot`, which can sit above `low_water`, and then
  no decode engine could ever be released.)

When one load is above `high_water` and the lighter pool, having given up one engine, would
still be below `low_water` (its load with its work spread over one engine fewer), the engine
that is cheapest to move leaves the lighter pool for the heavier one, provided the lighter
pool keeps its floor (`min_prefill`, `min_decode`) and the engine's last flip is older than
`cooldown_s`.

Mode `planner` (planner.py) replaces the two marks with a target split sized from the demand
of the last `window_s` seconds; the controller then moves one engine per tick towards it,
under the same floors, cooldown and drain rules.
The gap between the marks and the cooldown are the hysteresis: a load hovering near one mark
cannot flip an engine back and forth.

An engine leaving the decode pool drains first: it takes no new decode legs at once, its
running streams finish, and only when none is left does it take prefills (a prefill beside
running streams would stretch their TPOT, the interference disaggregation removes). While
one engine drains no other flip is decided, so the controller moves one engine at a time.
An engine leaving the prefill pool takes decode legs at once; its queued prefills finish.

Flips are counted (`narwhal_router_role_flips_total{from,to}`) and each engine's current
role and last flip (when, why, both loads) are in /narwhal/state; nothing else records them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from narwhal.core.fleet import RoleFlips
from narwhal.serve.router.scheduling.costs import arrival_s, decode_step_s
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.scheduling.planner import (
    DemandWindow,
    PoolShape,
    Refused,
    Sample,
    Sizing,
    StepCost,
    plan_prefill,
    spread_step_s,
)
from narwhal.serve.router.scheduling.pricing import tpot_bias_s

_log = logging.getLogger("narwhal.serve.router.scheduling.roles")

PREFILL = "prefill"
DECODE = "decode"
DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Member:
    """What a decision reads about one `both` engine."""

    id: str
    role: str  # PREFILL, DECODE or DRAINING (on its way from decode to prefill)
    cooled: bool  # its last flip is at least `cooldown_s` old
    running: int  # decode legs running there: how long a drain would take
    queue_s: float  # prefill queued there: what moving it away would strand


@dataclass(frozen=True, slots=True)
class Flip:
    engine_id: str
    from_role: str
    to_role: str
    why: str


def decide(members: Sequence[Member], prefill_load: float, decode_load: float,
           policy: RoleFlips, *, spare_prefill: float | None = None,
           spare_decode: float | None = None) -> Flip | None:
    """The one flip this tick calls for, or None. Pure, so every rule is unit-tested.

    `spare_prefill`/`spare_decode` are each pool's load with one engine fewer (None: the
    current load); the lighter pool must stay below the low mark after giving one up."""
    if any(m.role == DRAINING for m in members):
        return None  # one engine at a time: wait until the drain completes
    high, low = policy.high_water, policy.low_water
    after_prefill = prefill_load if spare_prefill is None else spare_prefill
    after_decode = decode_load if spare_decode is None else spare_decode
    n_prefill = sum(1 for m in members if m.role == PREFILL)
    n_decode = sum(1 for m in members if m.role == DECODE)
    loads = f"prefill load {prefill_load:.2f}, decode load {decode_load:.2f}"
    if prefill_load > high and after_decode < low and n_decode > policy.min_decode:
        pick = _cheapest_to_move(members, DECODE)
        if pick is not None:
            return Flip(pick.id, DECODE, PREFILL,
                        f"{loads}: prefill above high water {high:g}, decode below low water {low:g}")
    if decode_load > high and after_prefill < low and n_prefill > policy.min_prefill:
        pick = _cheapest_to_move(members, PREFILL)
        if pick is not None:
            return Flip(pick.id, PREFILL, DECODE,
                        f"{loads}: decode above high water {high:g}, prefill below low water {low:g}")
    return None


def initial_prefill(count: int, policy: RoleFlips) -> int:
    """How many of `count` both-engines start as prefill: half (rounded down), within floors."""
    return max(policy.min_prefill, min(count // 2, count - policy.min_decode))


class RoleController:
    """Holds the current role of every `both` engine and flips them as `decide` says."""

    def __init__(self, engines: Sequence[Engine], ttft_s: float, tpot_s: float,
                 policy: RoleFlips, clock: Callable[[], float] = time.monotonic,
                 offered_prefill_s: Callable[[], float] | None = None,
                 refused_decode: Callable[[], Refused] | None = None,
                 offered_requests: Callable[[], int] | None = None) -> None:
        self.engines = tuple(engines)
        self.members = tuple(e for e in engines if e.spec.role == "both")
        self.policy = policy
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self._clock = clock
        self._flipped_at: dict[str, float] = {}
        self.flips: dict[tuple[str, str], int] = {}
        self.prefill_load = 0.0
        self.decode_load = 0.0
        # Planner mode: cumulative prefill seconds offered to the fleet (the scheduler counts
        # them, refused requests included) sampled over a sliding window.
        self._offered = offered_prefill_s or (lambda: 0.0)
        # ... the decode work of the requests it refused, and the requests offered.
        self._refused_decode = refused_decode or Refused
        self._offered_requests = offered_requests or (lambda: 0)
        self.window = DemandWindow(policy.window_s)
        self.target_prefill: int | None = None
        first = initial_prefill(len(self.members), policy)
        for i, engine in enumerate(self.members):
            engine.serves_prefill = i < first
            engine.serves_decode = i >= first

    def role_of(self, engine: Engine) -> str:
        return DRAINING if engine.draining else (PREFILL if engine.serves_prefill else DECODE)

    def loads(self, now: float) -> tuple[float, float, float, float]:
        """(prefill load, decode load, each with one engine fewer); see the module doc."""
        best = math.inf
        worst = 0.0
        queued_total = 0.0
        a_s = 0.0
        n_prefill = n_decode = streams = resident = 0
        spare_curve = None
        for engine in self.engines:
            profile = engine.profile
            if profile is None or not engine.placeable:
                continue
            if engine.serves_prefill:
                queued = engine.load.busy_until - now
                queued = queued if queued > 0.0 else 0.0
                best = min(best, queued + profile.prefill.a_s)
                queued_total += queued
                a_s = max(a_s, profile.prefill.a_s)
                n_prefill += 1
            if engine.serves_decode:
                worst = max(worst, _headroom_used(decode_step_s(engine), profile.decode.base_s,
                                                  self.tpot_s))
                streams += engine.load.running
                resident += engine.load.resident_tokens
                n_decode += 1
                spare_curve = profile.decode
        prefill = best / self.ttft_s if best != math.inf else 0.0
        spare_prefill = (queued_total / (n_prefill - 1) + a_s) / self.ttft_s \
            if n_prefill > 1 else math.inf
        spare_decode = math.inf
        if n_decode > 1 and spare_curve is not None:
            step = spread_step_s(spare_curve, resident, streams, n_decode - 1)
            spare_decode = _headroom_used(step, spare_curve.base_s, self.tpot_s)
        return prefill, worst, spare_prefill, spare_decode

    def _plan(self, now: float) -> int | None:
        """Planner mode: sample the window; the number of `both` engines that should prefill."""
        streams = sum(e.load.running for e in self.engines)
        resident = sum(e.load.resident_tokens for e in self.engines)
        arrivals = sum(e.load.arrival_rate for e in self.engines)
        self.window.add(Sample(now, self._offered(), streams, resident, arrivals,
                               self._offered_requests(), self._refused_decode()))
        demand = self.window.demand()
        profile = next((e.profile for e in self.members if e.profile is not None), None)
        if demand is None or profile is None:
            return None
        fixed_prefill = sum(1 for e in self.engines if e.spec.role == "prefill" and e.placeable)
        fixed_decode = sum(1 for e in self.engines if e.spec.role == "decode" and e.placeable)
        movable = sum(1 for e in self.members if e.placeable)
        policy = self.policy
        shape = PoolShape(movable, fixed_prefill, fixed_decode,
                          min(policy.min_prefill, movable), min(policy.min_decode, movable))
        if shape.min_prefill + shape.min_decode > movable:
            return None
        # The step admission judges: each landing leg's cost and the decode engines' mean
        # learned bias, bounded as admission bounds it.
        decoding = [e for e in self.engines if e.serves_decode and e.placeable]
        bias = (sum(tpot_bias_s(e.load.tpot_error_s, self.tpot_s) for e in decoding) / len(decoding)
                if decoding else 0.0)
        sizing = Sizing(profile.decode, self.ttft_s, self.tpot_s, policy.prefill_utilization,
                        policy.decode_utilization, StepCost(arrival_s(profile), bias),
                        len(decoding))
        current = sum(1 for e in self.members
                      if e.placeable and (e.serves_prefill or e.draining))
        target = plan_prefill(demand, shape, sizing, current)
        if target != self.target_prefill:
            _log.info("planner: %d of %d engines should prefill (prefill %.3f s/s, %.1f "
                      "requests/s, %.1f streams, %.0f resident tokens, %.3f legs landing a "
                      "step, step bias %.4f s)", target, movable, demand.prefill_rate,
                      demand.requests, demand.streams, demand.resident_tokens,
                      demand.arrivals, bias)
        return target

    def _toward(self, target: int, members: Sequence[Member]) -> Flip | None:
        """One flip towards `target` prefill engines; none while an engine drains."""
        if any(m.role == DRAINING for m in members):
            return None
        n_prefill = sum(1 for m in members if m.role == PREFILL)
        why = (f"planner: {target} of {len(members)} engines should prefill "
               f"(prefill load {self.prefill_load:.2f}, decode load {self.decode_load:.2f})")
        if target == n_prefill:
            return None
        src, dst = (DECODE, PREFILL) if target > n_prefill else (PREFILL, DECODE)
        pick = _cheapest_to_move(members, src)
        return None if pick is None else Flip(pick.id, src, dst, why)

    def tick(self) -> Flip | None:
        """Finish drains, then decide and apply at most one flip."""
        now = self._clock()
        for engine in self.members:
            if engine.draining and engine.load.running <= 0 and engine.load.reserved <= 0:
                engine.draining = False
                engine.serves_prefill = True
        self.prefill_load, self.decode_load, spare_prefill, spare_decode = self.loads(now)
        cooldown = self.policy.cooldown_s
        members = [Member(e.id, self.role_of(e),
                          now - self._flipped_at.get(e.id, -math.inf) >= cooldown,
                          e.load.running, max(0.0, e.load.busy_until - now))
                   for e in self.members if e.placeable]
        if self.policy.mode == "planner":
            self.target_prefill = self._plan(now)
            flip = None if self.target_prefill is None else self._toward(self.target_prefill,
                                                                         members)
        else:
            flip = decide(members, self.prefill_load, self.decode_load, self.policy,
                          spare_prefill=spare_prefill, spare_decode=spare_decode)
        if flip is not None:
            self._apply(flip, now)
        return flip

    def _apply(self, flip: Flip, now: float) -> None:
        engine = next(e for e in self.members if e.id == flip.engine_id)
        if flip.to_role == PREFILL:
            engine.serves_decode = False
            engine.draining = engine.load.running > 0 or engine.load.reserved > 0
            engine.serves_prefill = not engine.draining
        else:
            engine.serves_prefill = False
            engine.serves_decode = True
        self._flipped_at[engine.id] = now
        key = (flip.from_role, flip.to_role)
        self.flips[key] = self.flips.get(key, 0) + 1
        engine.last_flip = {
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "from": flip.from_role, "to": flip.to_role, "why": flip.why,
            "prefill_load": round(self.prefill_load, 4),
            "decode_load": round(self.decode_load, 4)}
        _log.info("role flip: %s %s -> %s (%s)", engine.id, flip.from_role, flip.to_role,
                  flip.why)

    async def run(self) -> None:
        """Tick every interval until cancelled (the router cancels it at shutdown)."""
        period = self.policy.interval_s
        while True:
            await asyncio.sleep(period)
            try:
                self.tick()
            except Exception:  # a bad tick must not end role control for the process
                _log.exception("role controller tick failed")

    def state(self) -> dict[str, Any]:
        """For /narwhal/state: the policy, the last loads seen and the flip counts."""
        return {
            "policy": self.policy.model_dump(),
            "prefill_load": round(self.prefill_load, 4),
            "decode_load": round(self.decode_load, 4),
            "target_prefill": self.target_prefill,
            "demand": None if (d := self.window.demand()) is None else {
                "prefill_s_per_s": round(d.prefill_rate, 4), "streams": round(d.streams, 2),
                "resident_tokens": round(d.resident_tokens),
                "arrivals_per_step": round(d.arrivals, 4),
                "requests_per_s": round(d.requests, 2)},
            "roles": {e.id: self.role_of(e) for e in self.members},
            "flips": [{"from": f, "to": t, "count": n} for (f, t), n in sorted(self.flips.items())],
        }


def _cheapest_to_move(members: Sequence[Member], role: str) -> Member | None:
    """The cooled member of `role` whose move costs least: a decode engine with the fewest
    streams to drain, a prefill engine with the least queued prefill to strand."""
    ready = [m for m in members if m.role == role and m.cooled]
    if not ready:
        return None
    if role == DECODE:
        return min(ready, key=lambda m: (m.running, m.id))
    return min(ready, key=lambda m: (m.queue_s, m.id))


def _headroom_used(step_s: float, base_s: float, tpot_s: float) -> float:
    """Share of the TPOT headroom above the curve's idle step that `step_s` uses."""
    room = tpot_s - base_s
    if room <= 0.0:
        return math.inf  # this engine cannot meet the budget even idle
    return (step_s - base_s) / room
