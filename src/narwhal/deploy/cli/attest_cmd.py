"""`narwhal attest`: Gate E, every engine's sidecar at once, checked from the router host."""

from __future__ import annotations

import argparse

from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command

HELP = ("gate E: start every engine's attestation sidecar and check it from the "
        "router host")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_gate_parser(sub, "attest", HELP, run)


def run(args: argparse.Namespace) -> int:
    return run_gate_command(args, "attest", None)
