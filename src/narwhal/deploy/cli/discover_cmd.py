"""`narwhal discover`: Gate A, every host inspected at once, a table and `--json`."""

from __future__ import annotations

import argparse

from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command

HELP = "gate A: freeze inputs and discover the real deployment"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_gate_parser(sub, "discover", HELP, run)


def run(args: argparse.Namespace) -> int:
    return run_gate_command(args, "discover", None)
