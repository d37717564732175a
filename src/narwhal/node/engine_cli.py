"""`narwhal-engine`: Checked engine launch on an engine host and capture of the live KV cache it allocated (gate C)."""

from __future__ import annotations

import argparse

from narwhal.core.cli_common import not_built

DESCRIPTION = "Checked engine launch on an engine host and capture of the live KV cache it allocated (gate C)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="narwhal-engine", description=DESCRIPTION)
    parser.parse_args(argv)
    return not_built("narwhal-engine", DESCRIPTION)
