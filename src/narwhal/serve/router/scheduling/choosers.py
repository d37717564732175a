"""The scheduling seam the proxy places requests through, and its plainest policy.

`EngineChooser` is what the request path sees of scheduling: place a request, another engine
for a failed leg, a request ended, and the chooser's `Bookings` (bookings.py), to which the
proxy reports every leg's events. `LeastOutstanding` fills it when a fleet has no profiles;
the curve-priced chooser (scheduler.py), role flips and generation holds replace it behind
the same methods without touching the data path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from narwhal.serve.router.scheduling.bookings import Bookings
from narwhal.serve.router.scheduling.engines import Engine, Placement, Refusal, RequestFacts


class EngineChooser(Protocol):
    @property
    def bookings(self) -> Bookings:
        """Where the proxy reports each leg's events; the chooser prices on what it holds."""
        ...

    def place(self, facts: RequestFacts) -> Placement | Refusal | None: ...

    def another_prefill(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None: ...

    def another_decode(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None: ...

    def finished(self, facts: RequestFacts) -> None:
        """A request that `place` placed has ended (whatever its outcome)."""


class LeastOutstanding:
    """Each leg goes to the admitted engine with the fewest legs in flight.

    Ties rotate so equal engines share load. For the decode leg a tie prefers the engine
    already chosen for prefill: one plain request then replaces two legs and a KV handoff.
    """

    def __init__(self, engines: Sequence[Engine]) -> None:
        self._prefill = tuple(e for e in engines if e.spec.can_prefill)
        self._decode = tuple(e for e in engines if e.spec.can_decode)
        self._turn = 0
        self.bookings = Bookings()

    def _least(self, pool: tuple[Engine, ...], exclude: Sequence[Engine],
               prefer: Engine | None = None, *, prefill: bool) -> Engine | None:
        best: Engine | None = None
        best_key = 1 << 62
        n = len(pool)
        start = self._turn % n if n else 0
        for k in range(n):
            engine = pool[(start + k) % n]
            if engine.ejected or engine.held or engine in exclude:
                continue
            if not (engine.serves_prefill if prefill else engine.serves_decode):
                continue
            key = engine.outstanding * 2 + (0 if engine is prefer else 1)
            if key < best_key:
                best, best_key = engine, key
        return best

    def place(self, facts: RequestFacts) -> Placement | None:
        self._turn += 1
        first = self._least(self._prefill, (), prefill=True)
        if first is None:
            return None
        decode = self._least(self._decode, (), prefer=first, prefill=False)
        if decode is None:
            return None
        return Placement(first, decode)

    def another_prefill(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._least(self._prefill, exclude, prefill=True)

    def another_decode(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._least(self._decode, exclude, prefill=False)

    def finished(self, facts: RequestFacts) -> None:
        pass
