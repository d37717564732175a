"""`narwhal discover`: Gate A, with progress per host, a summary table and `--json`."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.gates import discover
from narwhal.deploy.gates.runner import run_gate


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("discover", help="gate A: freeze inputs and discover the real deployment")
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(handler=run)


class _Progress:
    """One line per host as its inspection starts and ends (stderr, so --json stays clean)."""

    def __init__(self, quiet: bool) -> None:
        self.console = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.started: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, alias: str, what: str) -> None:
        with self.lock:
            now = time.monotonic()
            if what == "inspecting":
                self.started[alias] = now
            took = f" ({now - self.started.get(alias, now):.1f} s)" if what != "inspecting" else ""
            if not self.quiet:
                self.console.print(f"  {alias}: {what}{took}")


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    sessions = ctx.sessions()
    progress = _Progress(args.json)
    targets = discover.plan(ctx.inputs)
    plan_doc = {"targets": [{"alias": t.alias, "role": t.role, "request": t.request}
                            for t in targets]}
    if not args.json:
        progress.console.print(f"narwhal discover: inspecting {len(targets)} host(s) at once")
    try:
        result = run_gate(discover.SPEC, ctx.ledger, ctx.fingerprints(), sessions.roles(),
                          ctx.inputs.revision, plan_doc,
                          lambda attempt: discover.execute(ctx.inputs, sessions, attempt,
                                                           targets, progress))
    except GateBlocked as exc:
        _report_blocked(args, exc)
        return EXIT_FAILED
    finally:
        ctx.close()
    attempt = ctx.ledger.load()["gates"]["discover"]["last"]
    if args.json:
        print(json.dumps({"gate": "discover", "verdict": "passed", "attempt": attempt,
                          "engines": result["engines"]}, indent=1))
    else:
        _table(result)
        print(f"gate A passed: evidence in {ctx.ledger.attempt_folder('discover', attempt)}")
    return EXIT_OK


def _report_blocked(args: argparse.Namespace, exc: GateBlocked) -> None:
    if args.json:
        print(json.dumps({"gate": "discover", "verdict": "blocked", "cause": exc.cause,
                          "problems": [{"field": p.field, "problem": p.problem, "fix": p.fix}
                                       for p in exc.problems]}, indent=1))
        return
    print(f"narwhal discover: blocked, {len(exc.problems) or 1} problem(s); nothing was "
          "generated:", file=sys.stderr)
    for p in exc.problems:
        print(f"  - {p.line()}", file=sys.stderr)
    if not exc.problems:
        print(f"  - {exc.cause}", file=sys.stderr)


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
