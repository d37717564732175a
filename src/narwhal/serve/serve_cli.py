"""`narwhal-serve`: The prefill/decode-aware router in front of the fleet (gate G)."""

from __future__ import annotations

import argparse

from narwhal.core.cli_common import not_built

DESCRIPTION = "The prefill/decode-aware router in front of the fleet (gate G)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="narwhal-serve", description=DESCRIPTION)
    parser.parse_args(argv)
    return not_built("narwhal-serve", DESCRIPTION)
