"""`narwhal install`: Gate B, with progress per host, a summary table and `--json`.

`--prepare-only` writes the prepared run (runs/<deployment>/deployment-env/<run>/) and sends
nothing; `--prepared RUN` installs a run prepared earlier, after checking that none of its
files changed since.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import narwhal
from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.cli.gate_output import Progress, report_blocked, report_passed
from narwhal.deploy.gates import install
from narwhal.deploy.gates.runner import run_gate

# The checkout this narwhal runs from (an editable install): where the revision is taken.
DEFAULT_CHECKOUT = Path(narwhal.__file__).resolve().parents[2]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("install", help="gate B: package and install the approved revision")
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    progress = Progress(args.json)
    try:
        if args.prepared:
            prepared = install.load_prepared(ctx.ledger, args.prepared, ctx.inputs)
        else:
            prepared = install.plan(ctx.inputs, ctx.ledger, args.runs, args.checkout,
                                    args.wheelhouse, progress)
        if args.prepare_only:
            _say(args, {"gate": "install", "verdict": "prepared", "prepared_run":
                        prepared.run_id, "folder": str(prepared.folder)},
                 f"prepared run {prepared.run_id}: {prepared.folder}")
            return EXIT_OK
        sessions = ctx.sessions()
        progress.say(f"narwhal install: {len(prepared.hosts)} host(s) at once, revision "
                     f"{prepared.revision[:12]}")
        result = run_gate(install.SPEC, ctx.ledger, ctx.fingerprints(), sessions.roles(),
                          ctx.inputs.revision, install.plan_document(prepared),
                          lambda attempt: install.execute(sessions, attempt, prepared,
                                                          progress))
    except GateBlocked as exc:
        report_blocked("install", args, exc)
        return EXIT_FAILED
    finally:
        ctx.close()
    report_passed("install", args, ctx.ledger, result, lambda: _table(result))
    return EXIT_OK


def _say(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    print(json.dumps(doc, indent=1) if args.json else text)


def _table(result: dict[str, Any]) -> None:
    table = Table(title=f"installed revision {result['revision'][:12]}")
    for column in ("host", "roles", "outcome", "files sent", "pip", "checked"):
        table.add_column(column)
    for alias, r in result["hosts"].items():
        table.add_row(alias, ", ".join(r["roles"]), r["outcome"], str(r["files_sent"]),
                      "ran" if r["pip_ran"] else "not needed", ", ".join(r["smoke"]))
    Console().print(table)
