"""`narwhal preflight`: Gate F on the router host, with progress, a summary table and `--json`."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.deploy.cli.context import Context
from narwhal.deploy.cli.gate_command import (
    Execute,
    add_gate_parser,
    on_host,
    router_alias,
    run_gate_command,
)
from narwhal.deploy.cli.gate_output import Progress
from narwhal.deploy.gates import preflight
from narwhal.deploy.hosts.sessions import Sessions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_gate_parser(sub, "preflight", "gate F: profile what is not profiled and run the live "
                       "KV contract, on the router host", run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    progress = Progress(args.json)

    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        router = router_alias(sessions)
        p = preflight.plan(ctx.inputs, ctx.ledger, router)
        progress.say(f"narwhal preflight: {len(p.fleet['engines'])} engine(s), on {router}")
        return p.document(), on_host(sessions, router, lambda host, attempt: preflight.execute(
            host, attempt, p, progress))

    return run_gate_command(args, ctx, preflight.SPEC, prepare, _table)


def _table(result: dict[str, Any]) -> None:
    table = Table(title=f"preflight passed on {result['router_host']}")
    for column in ("gate", "passed"):
        table.add_column(column)
    table.add_row("profiled now", ", ".join(result["profiled"]) or "none (every row binds)")
    for gate, subjects in result["passed"].items():
        table.add_row(gate, ", ".join(subjects))
    Console().print(table)
