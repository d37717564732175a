"""Run one step per item concurrently (hosts, engines) and keep every item's outcome."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Outcome(Generic[T, R]):
    item: T
    value: R | None
    error: Exception | None


def each(items: Sequence[T], step: Callable[[T], R], *, workers: int = 16) -> list[Outcome[T, R]]:
    """`step` on every item at once (up to `workers` threads); outcomes in the items' order.

    An exception ends only its own item: the others finish, so one unreachable host does not
    hide what every other host would have reported."""
    def guarded(item: T) -> Outcome[T, R]:
        try:
            return Outcome(item, step(item), None)
        except Exception as exc:
            return Outcome(item, None, exc)

    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        return list(pool.map(guarded, items))
