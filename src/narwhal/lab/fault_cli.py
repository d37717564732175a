"""`narwhal lab fault ...` (filled in below)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("fault", help="inject or clear a fault")
    common(p)
