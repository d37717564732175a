"""Which ordered producer -> consumer pairs the kv gate and the calibration measure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar
from urllib.parse import urlsplit

from narwhal.core.fleet import EngineEntry

R = TypeVar("R")


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


def host_of(engines: Sequence[EngineEntry]) -> dict[str, str]:
    """Each engine's host, as its URL names it (engines on one host share its NIC)."""
    return {e.id: urlsplit(e.url).hostname or e.url for e in engines}


def rounds(pairs: Sequence[tuple[str, str]], hosts: Mapping[str, str]
           ) -> list[list[tuple[str, str]]]:
    """The pairs in rounds that can run at once: within a round no host is in two pairs, as
    producer or consumer, so no two checks share an engine's queue or a host's NIC, and each
    pair is timed as it would be alone. Ordered pairs of n hosts take about 2n rounds instead
    of n(n-1) turns; a fleet on one host (the component and real tiers) stays one at a time.
    Greedy, each round taking the remaining pairs in their given order."""
    left = list(pairs)
    out: list[list[tuple[str, str]]] = []
    while left:
        busy: set[str] = set()
        batch, rest = [], []
        for p, c in left:
            ends = {hosts[p], hosts[c]}
            if ends & busy:
                rest.append((p, c))
            else:
                batch.append((p, c))
                busy |= ends
        out.append(batch)
        left = rest
    return out


async def in_rounds(engines: Sequence[EngineEntry], pairs: Sequence[tuple[str, str]],
                    check: Callable[[str, str], Awaitable[R]]) -> list[R]:
    """`check(producer, consumer)` of every pair, a round at a time (`rounds`): the results
    in the pairs' order."""
    done: dict[tuple[str, str], R] = {}
    for batch in rounds(pairs, host_of(engines)):
        got = await asyncio.gather(*(check(p, c) for p, c in batch))
        done.update(zip(batch, got, strict=True))
    return [done[pair] for pair in pairs]
