"""Which producer -> consumer pairs the canary holds out of placement, and why.

A pair is held from the first probe that does not pass until `release_after` probes in a row
pass again; the engines themselves stay placeable (a pair's handoff is what failed, not the
engines: they keep serving whole requests and every other pair). The proxy asks `held` before
it sends a decode leg with another engine's KV; the state and metrics show each pair's last
verdict and its evidence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from narwhal.serve.router.canary.judge import Verdict


@dataclass
class PairState:
    held: bool = False
    verdict: str = ""
    evidence: str = ""
    probes: int = 0
    passes_in_a_row: int = 0
    held_since: float | None = None  # wall clock
    last_probe_at: float | None = None  # wall clock


class PairHolds:
    """Every ordered pair the canary has probed, and the held ones."""

    def __init__(self, release_after: int, registry: CollectorRegistry | None = None) -> None:
        self.release_after = release_after
        self.pairs: dict[tuple[str, str], PairState] = {}
        self._held: set[tuple[str, str]] = set()
        self._probes = Counter(
            "narwhal_router_kv_canary_probes", "Canary probes of a producer -> consumer pair, "
            "by verdict", ("producer", "consumer", "verdict"), registry=registry) \
            if registry is not None else None
        self._gauge = Gauge(
            "narwhal_router_kv_pair_held", "1 while the canary holds the producer -> consumer "
            "pair out of placement", ("producer", "consumer"), registry=registry) \
            if registry is not None else None

    def held(self, producer: str, consumer: str) -> bool:
        return (producer, consumer) in self._held

    def record(self, producer: str, consumer: str, verdict: Verdict) -> None:
        pair = (producer, consumer)
        state = self.pairs.setdefault(pair, PairState())
        state.probes += 1
        state.verdict, state.evidence = verdict.kind, verdict.detail
        state.last_probe_at = time.time()
        if verdict.ok:
            state.passes_in_a_row += 1
            if state.held and state.passes_in_a_row >= self.release_after:
                state.held, state.held_since = False, None
                self._held.discard(pair)
        else:
            state.passes_in_a_row = 0
            if not state.held:
                state.held, state.held_since = True, time.time()
                self._held.add(pair)
        if self._probes is not None and self._gauge is not None:
            self._probes.labels(producer, consumer, verdict.kind).inc()
            self._gauge.labels(producer, consumer).set(1 if state.held else 0)

    def state(self) -> dict[str, Any]:
        return {f"{p}->{c}": {"held": s.held, "verdict": s.verdict, "evidence": s.evidence,
                              "probes": s.probes, "held_since": s.held_since,
                              "last_probe_at": s.last_probe_at}
                for (p, c), s in sorted(self.pairs.items())}

