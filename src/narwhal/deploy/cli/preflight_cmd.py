"""`narwhal preflight`: Gate F on the router host, with progress, a summary table and `--json`."""

from __future__ import annotations

import argparse

from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command

HELP = ("gate F: profile what is not profiled and run the live KV contract, on the "
        "router host")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_gate_parser(sub, "preflight", HELP, run)


def run(args: argparse.Namespace) -> int:
    return run_gate_command(args, "preflight", None)
