"""The shape every gate command shares: plan, run the gate on the spine, report the verdict.

`prepare` gets the run's sessions and returns the plan document (recorded first) and the
execute step; a GateBlocked anywhere is the blocked verdict (exit 1), and the sessions are
closed however it ends.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.cli.gate_output import report_blocked, report_passed
from narwhal.deploy.gates.runner import run_gate
from narwhal.deploy.gates.spec import GateSpec
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.ledger.attempt import Attempt

Execute = Callable[[Attempt], dict[str, Any]]
Handler = Callable[[argparse.Namespace], int]


def add_gate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                    help_text: str, handler: Handler) -> argparse.ArgumentParser:
    """A gate command's parser: the common flags and `--json`; the caller adds its own."""
    p = sub.add_parser(name, help=help_text)
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(handler=handler)
    return p


def router_alias(sessions: Sessions) -> str:
    """The physical host that holds the router role."""
    return next(alias for alias, roles in sessions.roles().items() if "router" in roles)


def on_host(sessions: Sessions, alias: str, work: Callable[[Host, Attempt], dict[str, Any]]
            ) -> Execute:
    """An execute step that runs on one host, every command of it recorded in the attempt."""
    def execute(attempt: Attempt) -> dict[str, Any]:
        host = sessions.get(alias)
        with attempt.bind(host):
            return work(host, attempt)
    return execute


def run_gate_command(args: argparse.Namespace, ctx: Context, spec: GateSpec,
                     prepare: Callable[[Sessions], tuple[Any, Execute]],
                     table: Callable[[dict[str, Any]], None]) -> int:
    try:
        sessions = ctx.sessions()
        plan_doc, execute = prepare(sessions)
        result = run_gate(spec, ctx.ledger, ctx.fingerprints(), sessions.roles(),
                          ctx.inputs.revision, plan_doc, execute)
    except GateBlocked as exc:
        report_blocked(spec.name, args, exc)
        return EXIT_FAILED
    finally:
        ctx.close()
    report_passed(spec.name, args, ctx.ledger, result, lambda: table(result))
    return EXIT_OK
