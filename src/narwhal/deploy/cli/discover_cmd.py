"""`narwhal discover`: Gate A, with progress per host, a summary table and `--json`."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.cli.gate_output import Progress, report_blocked, report_passed
from narwhal.deploy.gates import discover
from narwhal.deploy.gates.runner import run_gate


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("discover", help="gate A: freeze inputs and discover the real deployment")
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    sessions = ctx.sessions()
    progress = Progress(args.json)
    targets = discover.plan(ctx.inputs)
    plan_doc = {"targets": [{"alias": t.alias, "role": t.role, "request": t.request}
                            for t in targets]}
    progress.say(f"narwhal discover: inspecting {len(targets)} host(s) at once")
    try:
        result = run_gate(discover.SPEC, ctx.ledger, ctx.fingerprints(), sessions.roles(),
                          ctx.inputs.revision, plan_doc,
                          lambda attempt: discover.execute(ctx.inputs, sessions, attempt,
                                                           targets, progress))
    except GateBlocked as exc:
        report_blocked("discover", args, exc, "; nothing was generated")
        return EXIT_FAILED
    finally:
        ctx.close()
    report_passed("discover", args, ctx.ledger, {"engines": result["engines"]}, lambda: _table(result))
    return EXIT_OK


def _table(result: dict[str, Any]) -> None:
    table = Table(title="discovered engines")
    for column in ("engine", "host", "GPUs", "TP", "fabric", "image", "model tree"):
        table.add_column(column)
    for e in result["engines"]:
        gpus = ", ".join(f"{g['index']}:{str(g['uuid'])[:12]}" for g in e["gpus"])
        table.add_row(e["engine"], e["host"], gpus, str(e["tensor_parallel_size"]),
                      f"{e['fabric']['interface']} {e['fabric']['address']} mtu "
                      f"{e['fabric']['mtu']}", str(e["image"].get("id", ""))[:19],
                      str(e["model"].get("model_tree_sha256", ""))[:12])
    Console().print(table)
