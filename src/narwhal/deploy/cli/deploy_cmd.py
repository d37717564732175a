"""`narwhal deploy`: its flags; the run itself is deploy/actions/deploy.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from narwhal.core.flag_types import number
from narwhal.core.gates import GATES, Gate
from narwhal.core.gates import gate as gate_named
from narwhal.deploy.actions import deploy
from narwhal.deploy.actions.context import Context, add_common
from narwhal.deploy.actions.gate_commands import COMMANDS, DeployFlags
from narwhal.deploy.gates.registry import SPECS


def gate_flag(text: str) -> Gate:
    try:
        return gate_named(text)
    except KeyError as exc:
        raise argparse.ArgumentTypeError(str(exc.args[0])) from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("deploy", help="gates A..G in order: run what is not passed and fresh, "
                                      "keep the rest")
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--until", type=gate_flag, default=GATES[-1], metavar="GATE",
                   help="stop after this gate (name or letter; default G)")
    p.add_argument("--offline", action="store_true",
                   help="judge from the record only: do not ask the attested engines' "
                        "sidecars whether they still vouch")
    p.add_argument("--prepared", metavar="RUN", default=None,
                   help="gate B: install this prepared run (narwhal install --prepare-only)")
    p.add_argument("--wheelhouse", type=Path, default=None,
                   help="gate B: the folder holding runtime.lock's wheels")
    p.add_argument("--checkout", type=Path, default=None,
                   help="gate B: the git checkout holding the revision")
    p.add_argument("--fabric-seconds", type=number(int, 1, 600), default=None,
                   metavar="SECONDS",
                   help="gate D: seconds per edge sample (default: gate D's own)")
    p.add_argument("--fabric-omit", type=number(int, 0, 60), default=None, metavar="SECONDS",
                   help="gate D: seconds left out at the start of each sample (default: "
                        "gate D's own)")
    p.add_argument("--repair-checkpoint", action="store_true",
                   help="gate A: fetch again, from the pinned revision, each staged file "
                        "that differs on a host (without it a difference blocks, unchanged)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    flags = DeployFlags(args.prepared, args.wheelhouse, args.checkout, args.fabric_seconds,
                        args.repair_checkpoint, args.fabric_omit)
    plan = deploy.Plan(SPECS, COMMANDS, args.until.name, flags, args.json, args.offline)
    return deploy.run(Context.load(args), plan)
