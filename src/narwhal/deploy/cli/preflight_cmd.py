"""`narwhal preflight`: Gate F on the router host, with progress, a summary table and `--json`."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.cli.gate_command import Execute, run_gate_command
from narwhal.deploy.cli.gate_output import Progress
from narwhal.deploy.gates import preflight
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.ledger.attempt import Attempt


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("preflight", help="gate F: profile what is not profiled and run the live "
                       "KV contract, on the router host")
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    progress = Progress(args.json)

    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        router = next(alias for alias, roles in sessions.roles().items() if "router" in roles)
        p = preflight.plan(ctx.inputs, ctx.ledger, router)
        progress.say(f"narwhal preflight: {len(p.fleet['engines'])} engine(s), on {router}")

        def execute(attempt: Attempt) -> dict[str, Any]:
            host = sessions.get(router)
            with attempt.bind(host):
                return preflight.execute(ctx.ledger, host, attempt, p, progress)
        return p.document(), execute

    return run_gate_command(args, ctx, preflight.SPEC, prepare, _table)


def _table(result: dict[str, Any]) -> None:
    table = Table(title=f"preflight passed on {result['router_host']}")
    for column in ("gate", "passed"):
        table.add_column(column)
    table.add_row("profiled now", ", ".join(result["profiled"]) or "none (every row binds)")
    for gate, subjects in result["passed"].items():
        table.add_row(gate, ", ".join(subjects))
    Console().print(table)
