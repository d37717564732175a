"""`narwhal engines`: Gate C, with progress per engine, a summary table and `--json`."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.cli.gate_output import Progress, report_blocked, report_passed
from narwhal.deploy.gates import engines
from narwhal.deploy.gates.runner import run_gate


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("engines", help="gate C: validate and start every engine, capture its "
                       "live KV cache")
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    progress = Progress(args.json)
    try:
        targets, doc = engines.plan(ctx.inputs, ctx.ledger)
        sessions = ctx.sessions()
        progress.say(f"narwhal engines: {len(targets)} engine(s) in "
                     f"{len(doc['start_groups'])} start group(s)")
        result = run_gate(engines.SPEC, ctx.ledger, ctx.fingerprints(), sessions.roles(),
                          ctx.inputs.revision, doc,
                          lambda attempt: engines.execute(sessions, attempt, targets, doc,
                                                          progress))
    except GateBlocked as exc:
        report_blocked("engines", args, exc)
        return EXIT_FAILED
    finally:
        ctx.close()
    report_passed("engines", args, ctx.ledger, result, lambda: _table(result))
    return EXIT_OK


def _table(result: dict[str, Any]) -> None:
    table = Table(title="engines started and captured")
    for column in ("engine", "host", "vLLM", "compatibility hash", "healthy after"):
        table.add_column(column)
    for role, e in result["engines"].items():
        table.add_row(role, e["host"], e["version"], str(e["compatibility_hash"])[:16],
                      f"{e['healthy_after_s']:.1f} s")
    Console().print(table)
