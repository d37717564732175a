"""argparse `type=` parsers shared by the console scripts, so every command refuses a bad
number the same way: the flag named by argparse, the value, the range, exit 2."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from typing import Any

_KIND_WORDS = {int: "whole number", float: "number"}


def number(kind: type, low: float, high: float, *, above_low: bool = False) -> Callable[[str], Any]:
    """A parser for `kind` (int or float) within low..high; `above_low` excludes `low` itself.
    NaN passes no comparison, so it is refused like any value out of range."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {_KIND_WORDS.get(kind, kind.__name__)}") from None
        inside = (low < value if above_low else low <= value) and value <= high
        if not inside:
            bounds = f"above {low:g}" if above_low else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"{text} must be {bounds} and at most {high:g}")
        return value
    return parse


def increasing_ints(low: int = 1, high: int = 10_000_000) -> Callable[[str], tuple[int, ...]]:
    """`64,128,256`: whole numbers within low..high, comma-separated, strictly increasing."""
    one = number(int, low, high)

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(one(part.strip()) for part in text.split(",") if part.strip())
        if not values:
            raise argparse.ArgumentTypeError("give at least one number, comma-separated")
        if any(b <= a for a, b in itertools.pairwise(values)):
            raise argparse.ArgumentTypeError(f"{text!r} must be strictly increasing, e.g. 64,256,1024")
        return values
    return parse
