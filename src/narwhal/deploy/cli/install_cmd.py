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
from narwhal.core.documents import sha256_bytes
from narwhal.core.errors import GateBlocked
from narwhal.deploy.actions.command_line import add_gate_parser, run_gate_command
from narwhal.deploy.actions.context import Context
from narwhal.deploy.actions.gate_runs import DEFAULT_CHECKOUT, InstallOptions, prepared_install
from narwhal.deploy.actions.output import Progress, report_blocked
from narwhal.deploy.package import source, wheelhouse
from narwhal.deploy.package.prepared import revision_lock


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
    group.add_argument("--wheels-only", action="store_true",
                       help="only build the revision's runtime wheelhouse under RUNS/wheelhouse "
                       "(where a package index answers), for gate A's stage kit and gate B")


def run(args: argparse.Namespace) -> int:
    options = InstallOptions(args.wheelhouse, args.checkout, args.prepared)
    if args.wheels_only:
        return _wheels_only(args)
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


def _wheels_only(args: argparse.Namespace) -> int:
    """Build (or verify) the revision's wheelhouse where the gates look for it by default."""
    ctx = Context.load(args)
    root = source.checkout_root(args.checkout)
    lock_bytes, lock = revision_lock(root, source.resolve(root, ctx.inputs.revision))
    digest = sha256_bytes(lock_bytes)[:16]
    lock_path = ctx.runs / "builds" / f"lock-{digest}" / "runtime.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock_path.write_bytes(lock_bytes)
    folder = ctx.runs / "wheelhouse" / digest
    wheels = wheelhouse.build(folder, lock_path, lock)
    doc = {"wheelhouse": str(folder), "wheels": len(wheels)}
    print(json.dumps(doc, indent=1) if args.json else f"wheelhouse {folder}: {len(wheels)} wheels")
    return EXIT_OK
