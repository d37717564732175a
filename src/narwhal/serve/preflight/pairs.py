"""Which ordered producer -> consumer pairs the kv gate and the calibration measure."""

from __future__ import annotations

from collections.abc import Sequence

from narwhal.core.fleet import EngineEntry


def producers(engines: Sequence[EngineEntry]) -> list[str]:
    return [e.id for e in engines if e.role in ("prefill", "both")]


def consumers(engines: Sequence[EngineEntry]) -> list[str]:
    return [e.id for e in engines if e.role in ("decode", "both")]


def all_pairs(engines: Sequence[EngineEntry]) -> list[tuple[str, str]]:
    """Every ordered eligible pair except an engine with itself (n(n-1) for n `both` engines)."""
    return [(p, c) for p in producers(engines) for c in consumers(engines) if p != c]


def ring_pairs(engines: Sequence[EngineEntry]) -> list[tuple[str, str]]:
    """A cheaper subset in which every engine produces and consumes at least once.

    With all engines `both`: each produces for the next in fleet order and consumes from the
    previous (n pairs). With fixed roles: producer i feeds consumer i+1, wrapping both lists.
    """
    prod, cons = producers(engines), consumers(engines)
    if not prod or not cons:
        return []
    out: list[tuple[str, str]] = []
    for i in range(max(len(prod), len(cons))):
        p = prod[i % len(prod)]
        for step in range(len(cons)):
            c = cons[(i + 1 + step) % len(cons)]
            if c != p:
                if (p, c) not in out:
                    out.append((p, c))
                break
    return out
