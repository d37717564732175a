"""`narwhal serve`: Gate G's service on the router host, with progress, a table and `--json`."""

from __future__ import annotations

import argparse

from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command

HELP = ("gate G: start (or adopt) the router and its monitoring on the router host, "
        "checked through the private path")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_gate_parser(sub, "serve", HELP, run)


def run(args: argparse.Namespace) -> int:
    return run_gate_command(args, "serve", None)
