"""`narwhal kv`: KV contract planning (filled by the KV contract work)."""

from __future__ import annotations

import argparse

from narwhal.core.cli_common import not_built


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("kv", help="predict KV geometry, NIXL hash and fabric budget from a config")
    p.set_defaults(handler=lambda _a: not_built("narwhal kv", "KV contract planning"))
