"""Reactive role flips: `both` engines move between the prefill and decode pools as load shifts.

A kv_both engine serves either leg without a restart, so the split of the `both` engines
between a prefill pool and a decode pool is a router decision. Each such engine holds one
current role; a controller task, off the request path, looks at both pools every
`role_flips.interval_s` and moves at most one engine:

- prefill load: the predicted TTFT of the next request at its best prefill engine, taken from
  the scheduler's queue model (queued seconds + the curve's fixed cost), over `slo.ttft_s`;
- decode load: the worst predicted decode step time among the decode engines (the curve at
  the streams this router runs there), over `slo.tpot_s`.

When one load is above `high_water` and the other below `low_water`, the engine that is
cheapest to move leaves the lighter pool for the heavier one, provided the lighter pool keeps
its floor (`min_prefill`, `min_decode`) and the engine's last flip is older than `cooldown_s`.
The gap between the marks and the cooldown are the hysteresis: a load hovering near one mark
cannot flip an engine back and forth.

An engine leaving the decode pool drains first: it takes no new decode legs at once, its
running streams finish, and only when none is left does it take prefills (a prefill beside
running streams would stretch their TPOT, the interference disaggregation removes). While
one engine drains no other flip is decided, so the controller moves one engine at a time.
An engine leaving the prefill pool takes decode legs at once; its queued prefills finish.

Flips are counted (`narwhal_router_role_flips_total{from,to}`) and each engine's current
role and last flip (when, why, both loads) are in /narwhal/state; nothing else records them.
This is the reactive half of issue 6 item 3; a planner sizing both pools over a demand
window would set the split ahead of load instead.
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

from narwhal.serve.engines import Engine
from narwhal.serve.fleet import RoleFlips
from narwhal.serve.scheduler import decode_step_s

_log = logging.getLogger("narwhal.serve.roles")

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
           policy: RoleFlips) -> Flip | None:
    """The one flip this tick calls for, or None. Pure, so every rule is unit-tested."""
    if any(m.role == DRAINING for m in members):
        return None  # one engine at a time: wait until the drain completes
    high, low = policy.high_water, policy.low_water
    n_prefill = sum(1 for m in members if m.role == PREFILL)
    n_decode = sum(1 for m in members if m.role == DECODE)
    loads = f"prefill load {prefill_load:.2f}, decode load {decode_load:.2f}"
    if prefill_load > high and decode_load < low and n_decode > policy.min_decode:
        ready = [m for m in members if m.role == DECODE and m.cooled]
        if ready:
            pick = min(ready, key=lambda m: (m.running, m.id))  # shortest drain
            return Flip(pick.id, DECODE, PREFILL,
                        f"{loads}: prefill above high water {high:g}, decode below low water {low:g}")
    if decode_load > high and prefill_load < low and n_prefill > policy.min_prefill:
        ready = [m for m in members if m.role == PREFILL and m.cooled]
        if ready:
            pick = min(ready, key=lambda m: (m.queue_s, m.id))  # strands the least prefill
            return Flip(pick.id, PREFILL, DECODE,
                        f"{loads}: decode above high water {high:g}, prefill below low water {low:g}")
    return None


def initial_prefill(count: int, policy: RoleFlips) -> int:
    """How many of `count` both-engines start as prefill: half (rounded down), within floors."""
    return max(policy.min_prefill, min(count // 2, count - policy.min_decode))


class RoleController:
    """Holds the current role of every `both` engine and flips them as `decide` says."""

    def __init__(self, engines: Sequence[Engine], ttft_s: float, tpot_s: float,
                 policy: RoleFlips, clock: Callable[[], float] = time.monotonic) -> None:
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
        first = initial_prefill(len(self.members), policy)
        for i, engine in enumerate(self.members):
            engine.serves_prefill = i < first
            engine.serves_decode = i >= first

    def role_of(self, engine: Engine) -> str:
        return DRAINING if engine.draining else (PREFILL if engine.serves_prefill else DECODE)

    def loads(self, now: float) -> tuple[float, float]:
        """(prefill load, decode load), each relative to its SLO budget; see the module doc."""
        best = math.inf
        worst = 0.0
        for engine in self.engines:
            profile = engine.profile
            if profile is None or not engine.placeable:
                continue
            if engine.serves_prefill:
                queued = engine.busy_until - now
                best = min(best, (queued if queued > 0.0 else 0.0) + profile.prefill.a_s)
            if engine.serves_decode:
                worst = max(worst, decode_step_s(engine))
        prefill = best / self.ttft_s if best != math.inf else 0.0
        return prefill, worst / self.tpot_s

    def tick(self) -> Flip | None:
        """Finish drains, then decide and apply at most one flip."""
        now = self._clock()
        for engine in self.members:
            if engine.draining and engine.running <= 0:
                engine.draining = False
                engine.serves_prefill = True
        self.prefill_load, self.decode_load = self.loads(now)
        cooldown = self.policy.cooldown_s
        members = [Member(e.id, self.role_of(e),
                          now - self._flipped_at.get(e.id, -math.inf) >= cooldown,
                          e.running, max(0.0, e.busy_until - now)) for e in self.members]
        flip = decide(members, self.prefill_load, self.decode_load, self.policy)
        if flip is not None:
            self._apply(flip, now)
        return flip

    def _apply(self, flip: Flip, now: float) -> None:
        engine = next(e for e in self.members if e.id == flip.engine_id)
        if flip.to_role == PREFILL:
            engine.serves_decode = False
            engine.draining = engine.running > 0
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
            "roles": {e.id: self.role_of(e) for e in self.members},
            "flips": [{"from": f, "to": t, "count": n} for (f, t), n in sorted(self.flips.items())],
        }
