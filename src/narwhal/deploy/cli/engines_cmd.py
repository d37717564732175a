"""`narwhal engines`: Gate C, with progress per engine, a summary table and `--json`."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.errors import InputError, Problem
from narwhal.deploy.cli.context import Context
from narwhal.deploy.cli.gate_command import (
    Execute,
    add_gate_parser,
    run_gate_command,
)
from narwhal.deploy.cli.gate_output import Progress
from narwhal.deploy.gates import engines
from narwhal.deploy.hosts.sessions import Sessions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_gate_parser(sub, "engines", "gate C: validate and start every engine, capture its "
                       "live KV cache", run)
    p.add_argument("--recapture", type=roles_list, default=None, metavar="ENGINE[,ENGINE]",
                   help="after a restart with the same launch plan: capture only these "
                        "running engines again and keep the others' captures")
    p.add_argument("--restart", type=roles_list, default=None, metavar="ENGINE[,ENGINE]",
                   help="engines that are not running (crashed, or their host restarted): "
                        "start these again from their checked plan and capture them; keep "
                        "the others' captures (with --recapture: both)")


def roles_list(text: str) -> list[str]:
    roles = [r.strip() for r in text.split(",")]
    if not all(roles) or len(set(roles)) != len(roles):
        raise argparse.ArgumentTypeError("give engine ids separated by commas, each once")
    return roles


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    progress = Progress(args.json)

    def prepare(sessions: Sessions) -> tuple[Any, Execute]:
        targets, doc = engines.plan(ctx.inputs, ctx.ledger)
        if args.recapture is not None or args.restart is not None:
            again, restart = args.recapture or [], args.restart or []
            both = sorted(set(again) & set(restart))
            if both:
                raise InputError("--restart", [Problem("--restart", f"{', '.join(both)} "
                                                       "also given to --recapture", "name each "
                                                       "engine in one of the two")])
            carried = engines.carried_captures(ctx.ledger, targets, again + restart)
            doc["recapture"] = {"engines": again, "restart": restart, "carried": {
                role: art.attempt for role, art in carried.items()}}
            said = [f"capturing {', '.join(again)} again"] if again else []
            said += [f"starting {', '.join(restart)} again"] if restart else []
            progress.say(f"narwhal engines: {'; '.join(said)}; {len(carried)} capture(s) "
                         "carried")
            return doc, lambda attempt: engines.recapture(
                sessions, attempt, targets, doc, carried, progress, frozenset(restart))
        progress.say(f"narwhal engines: {len(targets)} engine(s) in "
                     f"{len(doc['start_groups'])} start group(s)")
        return doc, lambda attempt: engines.execute(sessions, attempt, targets, doc, progress)

    return run_gate_command(args, ctx, engines.SPEC, prepare, _table)


def _table(result: dict[str, Any]) -> None:
    table = Table(title="engines started and captured")
    for column in ("engine", "host", "vLLM", "compatibility hash", "healthy after"):
        table.add_column(column)
    for role, e in result["engines"].items():
        table.add_row(role, e["host"], e["version"], str(e["compatibility_hash"])[:16],
                      f"{e['healthy_after_s']:.1f} s")
    Console().print(table)
