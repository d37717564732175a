"""`narwhal-check`: Preflight: health, model, profile, pace, tokenize and live KV contract checks (gate F)."""

from __future__ import annotations

import argparse

from narwhal.core.cli_common import not_built

DESCRIPTION = "Preflight: health, model, profile, pace, tokenize and live KV contract checks (gate F)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="narwhal-check", description=DESCRIPTION)
    parser.parse_args(argv)
    return not_built("narwhal-check", DESCRIPTION)
