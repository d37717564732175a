"""`narwhal install`: Gate B, with progress per host, a summary table and `--json`.

`--prepare-only` writes the prepared run (runs/<deployment>/deployment-env/<run>/) and sends
nothing; `--prepared RUN` installs a run prepared earlier, after checking that none of its
files changed since.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked
from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command
from narwhal.deploy.actions.context import Context
from narwhal.deploy.actions.gate_runs import DEFAULT_CHECKOUT, InstallOptions, prepared_install
from narwhal.deploy.actions.output import Progress, report_blocked


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_gate_parser(sub, "install", "gate B: package and install the approved revision",
                        run)
    p.add_argument("--wheelhouse", type=Path, default=None,
                   help="a folder holding runtime.lock's wheels (a workstation without a "
                   "package index); default: build it once under RUNS/wheelhouse/")
    p.add_argument("--checkout", type=Path, default=DEFAULT_CHECKOUT,
                   help="the git checkout holding the revision (default: this narwhal's own)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prepare-only", action="store_true",
                       help="write the prepared run and send nothing")
    group.add_argument("--prepared", metavar="RUN", default=None,
                       help="install the run prepared earlier under deployment-env/RUN")


def run(args: argparse.Namespace) -> int:
    options = InstallOptions(args.wheelhouse, args.checkout, args.prepared)
    if args.prepare_only:
        return _prepare_only(args, options)
    return run_gate_command(args, "install", options)


def _prepare_only(args: argparse.Namespace, options: InstallOptions) -> int:
    """Write the prepared run and send nothing: where it is."""
    ctx = Context.load(args)
    try:
        prepared = prepared_install(ctx, options, Progress(args.json))
    except GateBlocked as exc:
        report_blocked("install", args.json, exc)
        return EXIT_FAILED
    doc = {"gate": "install", "verdict": "prepared", "prepared_run": prepared.run_id,
           "folder": str(prepared.folder)}
    print(json.dumps(doc, indent=1) if args.json else
          f"prepared run {prepared.run_id}: {prepared.folder}")
    return EXIT_OK
