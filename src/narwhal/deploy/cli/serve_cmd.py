"""`narwhal serve`: Gate G's service on the router host, with progress, a table and `--json`."""

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
from narwhal.deploy.gates import serve
from narwhal.deploy.hosts.sessions import Sessions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_gate_parser(sub, "serve", "gate G: start (or adopt) the router and its monitoring "
                       "on the router host, checked through the private path", run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    progress = Progress(args.json)

    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        router = router_alias(sessions)
        p = serve.plan(ctx.inputs, ctx.ledger, router)
        progress.say(f"narwhal serve: the router at {p.router_url} on {router}, "
                     f"{len(p.targets())} scrape targets")
        return p.document(), on_host(sessions, router, lambda host, attempt: serve.execute(
            ctx.inputs, ctx.ledger, host, attempt, p, progress))

    return run_gate_command(args, ctx, serve.SPEC, prepare, _table)


def _table(result: dict[str, Any]) -> None:
    table = Table(title=f"serving on {result['router_host']} at {result['router_url']}")
    for column in ("part", "state"):
        table.add_column(column)
    table.add_row("router", f"{result['router']} (pid {result.get('pid', '-')})")
    table.add_row("prometheus", f"pid {result['prometheus_pid']}, "
                  f"{sum(v == '1' for v in result['up'].values())}/{len(result['up'])} up")
    t = result["tunnel"]
    table.add_row("private path", f"/ready {t['ready']}, completion {t['completion']}")
    table.add_row("dashboard", f"{sum(n > 0 for n in result['panels'].values())}/"
                  f"{len(result['panels'])} panels with data")
    table.add_row("grafana", result["grafana"])
    Console().print(table)
