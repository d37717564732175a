"""`narwhal engines`: Gate C, with progress per engine, a summary table and `--json`."""

from __future__ import annotations

import argparse

from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command
from narwhal.deploy.actions.gate_runs import EngineOptions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_gate_parser(sub, "engines", "gate C: validate and start every engine, capture its "
                       "live KV cache", run)
    p.add_argument("--recapture", type=roles_list, default=None, metavar="ENGINE[,ENGINE]",
                   help="after a restart with the same launch plan: capture only these "
                        "running engines again and keep the others' captures")
    p.add_argument("--restart", type=roles_list, default=None, metavar="ENGINE[,ENGINE]",
                   help="engines that are not running (crashed, or their host restarted): "
                        "start these again from their checked plan and capture them; keep "
                        "the others' captures (with --recapture: both)")


def roles_list(text: str) -> list[str]:
    roles = [r.strip() for r in text.split(",")]
    if not all(roles) or len(set(roles)) != len(roles):
        raise argparse.ArgumentTypeError("give engine ids separated by commas, each once")
    return roles


def run(args: argparse.Namespace) -> int:
    options = EngineOptions(None if args.recapture is None else tuple(args.recapture),
                            None if args.restart is None else tuple(args.restart))
    return run_gate_command(args, "engines", options)
