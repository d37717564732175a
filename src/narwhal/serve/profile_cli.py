"""`narwhal-profile`: Measures prefill and decode cost curves of each live engine for the router (gate F)."""

from __future__ import annotations

import argparse

from narwhal.core.cli_common import not_built

DESCRIPTION = "Measures prefill and decode cost curves of each live engine for the router (gate F)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="narwhal-profile", description=DESCRIPTION)
    parser.parse_args(argv)
    return not_built("narwhal-profile", DESCRIPTION)
