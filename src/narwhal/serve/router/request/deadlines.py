"""One periodic sweep enforces every leg's deadline, instead of a timer per leg per chunk.

A leg in flight sets `deadline` (a `time.monotonic()` value) and is added here; relays push
their deadline forward on every read with one float store. The sweep runs a few times per
second and calls `expire()` on legs past due, so a timeout costs nothing on the hot path.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


def stall_s(idle_timeout_s: float, steps: int, floor_s: float, predicted_step_s: float) -> float:
    """How long a stream may go without a byte before it counts as stalled: `steps` of its
    predicted step (`predicted_step_s`, 0 when nothing predicted one), within
    [`floor_s`, `idle_timeout_s`]."""
    if predicted_step_s <= 0.0:
        return idle_timeout_s
    return min(idle_timeout_s, max(floor_s, steps * predicted_step_s))


def leg_deadline_s(predicted_s: float, factor: float, floor_s: float, cap_s: float) -> float:
    """How long a leg may take to its first byte: `factor` times what placement predicted it
    takes (`predicted_s`), within [`floor_s`, `cap_s`]; the cap when nothing predicted it."""
    if predicted_s <= 0.0:
        return cap_s
    return min(cap_s, max(floor_s, factor * predicted_s))


def handoff_deadline_s(budget_s: float, stall_s: float, cap_s: float) -> float:
    """How long a decode leg that pulls KV may take to its first byte: the transfer's budget
    (the one Gate D proved the edge meets) and then as long as a stream may go between two
    tokens; `cap_s` when no budget is known."""
    if budget_s <= 0.0:
        return cap_s
    return min(cap_s, budget_s + stall_s)


class Expirable(Protocol):
    deadline: float

    def expire(self) -> None: ...


class Deadlines:
    """The set of legs with a deadline, swept every `period_s`."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._legs: set[Expirable] = set()

    def add(self, leg: Expirable) -> None:
        self._legs.add(leg)

    def discard(self, leg: Expirable) -> None:
        self._legs.discard(leg)

    def sweep(self) -> int:
        now = time.monotonic()
        late = [leg for leg in self._legs if leg.deadline < now]
        for leg in late:
            self._legs.discard(leg)
            leg.expire()
            if leg.deadline > now:  # the leg gave itself more time (a stall it can explain)
                self._legs.add(leg)
        return len(late)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            self.sweep()
