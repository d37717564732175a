"""`narwhal discover`: Gate A, every host inspected at once, a table and `--json`."""

from __future__ import annotations

import argparse
from pathlib import Path

from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command
from narwhal.deploy.actions.gate_runs import DiscoverOptions

HELP = "gate A: freeze inputs and discover the real deployment"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_gate_parser(sub, "discover", HELP, run)
    p.add_argument("--repair-checkpoint", action="store_true",
                   help="with MODEL_REPO_ID: fetch again, from the pinned revision, each file "
                        "that differs on a host (without it a difference blocks, unchanged)")
    p.add_argument("--wheelhouse", type=Path, default=None,
                   help="a folder holding runtime.lock's wheels, for the stage kit (default: "
                        "build it once under RUNS/wheelhouse/)")


def run(args: argparse.Namespace) -> int:
    return run_gate_command(args, "discover", DiscoverOptions(
        args.repair_checkpoint, args.wheelhouse))
