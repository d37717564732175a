"""`narwhal attest`: Gate E, every engine's sidecar at once, checked from the router host."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.deploy.cli.context import Context
from narwhal.deploy.cli.gate_command import (
    Execute,
    add_gate_parser,
    router_alias,
    run_gate_command,
)
from narwhal.deploy.cli.gate_output import Progress
from narwhal.deploy.gates import attest
from narwhal.deploy.hosts.sessions import Sessions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_gate_parser(sub, "attest", "gate E: start every engine's attestation sidecar and "
                       "check it from the router host", run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    progress = Progress(args.json)

    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        router = router_alias(sessions)
        p = attest.plan(ctx.inputs, ctx.ledger, router)
        progress.say(f"narwhal attest: {len(p.sidecars)} sidecar(s) at once, checked from "
                     f"{router}")
        return p.document(), lambda attempt: attest.execute(ctx.inputs, sessions, ctx.ledger,
                                                            attempt, p, progress)

    return run_gate_command(args, ctx, attest.SPEC, prepare, _table)


def _table(result: dict[str, Any]) -> None:
    table = Table(title=f"engines attested (checked from {result['router_host']})")
    for column in ("engine", "attestation", "compatibility hash", "process", "sidecar"):
        table.add_column(column)
    for role, e in result["engines"].items():
        table.add_row(role, str(e["digest"])[:19], str(e["compatibility_hash"])[:16],
                      f"{e['process']['runtime']} {str(e['process']['id'])[:12]}",
                      e["sidecar"])
    Console().print(table)
