"""`narwhal trial`: the capacity trial through the private path (Gate G), one recorded activity."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked, NarwhalError
from narwhal.core.flag_types import number
from narwhal.deploy.actions.context import Context, add_common
from narwhal.deploy.actions.gate_runs import router_alias
from narwhal.deploy.actions.output import Progress, report_blocked
from narwhal.deploy.actions.status import rows_now
from narwhal.deploy.gates import serve, trial
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.ledger.status import GateStatus
from narwhal.deploy.trial.trace import Trace, TraceError, read_trace


def rates_list(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("give rates in requests per second, e.g. 2,4") from None
    if not rates or any(not 0 < r <= 10_000 for r in rates):
        raise argparse.ArgumentTypeError("each rate must be above 0 and at most 10000 per second")
    return rates


def trace_file(text: str) -> Trace:
    """`--trace FILE`, read and checked whole while the command line is parsed: a trace that
    is not the Mooncake format is refused before any host is asked or anything recorded."""
    try:
        return read_trace(Path(text))
    except TraceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trial", help="gate G: the capacity trial through the SSH tunnel")
    add_common(p)
    p.add_argument("--rates", type=rates_list, required=True, metavar="R1,R2,...",
                   help="offered rates, requests per second, run in this order")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--requests", type=number(int, 1, 100_000), default=None,
                      help="requests per rate (default 40)")
    size.add_argument("--duration", type=number(float, 1.0, 3600.0), default=None,
                      metavar="SECONDS", help="instead of --requests: each rate's schedule lasts "
                      "about this long (rate x seconds requests)")
    p.add_argument("--seed", type=number(int, 0, 2**31), default=0,
                   help="the arrival schedule's seed (default 0)")
    p.add_argument("--max-tokens", type=number(int, 1, 4096), default=16,
                   help="output tokens per request (default 16)")
    p.add_argument("--trace", type=trace_file, default=None, metavar="FILE",
                   help="replay a Mooncake-format trace (JSON lines: timestamp ms, "
                   "input_length, output_length, hash_ids) instead of unique prompts: its "
                   "timing stretched to each rate, its prompts scaled to the profiled range "
                   "with equal hash_ids as equal text; --requests/--duration take its first rows")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(handler=run)


def serve_row(ctx: Context) -> GateStatus:
    """Gate G as `narwhal status --offline` computes it: the record and the inputs now (a
    passed gate whose inputs or upstream moved is stale). No host is asked."""
    if not ctx.ledger.exists():
        return GateStatus("serve", "G", "pending", 0, "", "no deployment record yet", ())
    return next(r for r in rows_now(ctx, SPECS) if r.gate == "serve")


def _said(args: argparse.Namespace, verdict: str, cause: str) -> None:
    """One line on stderr, labelled as the trial's; with --json also one document on stdout."""
    if args.json:
        print(json.dumps({"activity": trial.ACTIVITY, "verdict": verdict, "cause": cause},
                         indent=1))
    print(f"narwhal {trial.COMMAND}: {cause}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    try:
        refused = trial.serve_refusal(serve_row(ctx))
        if refused:  # before any session opens: nothing sent, nothing recorded
            _said(args, "refused", refused)
            return EXIT_FAILED
        doc = _trial(ctx, args)
    except GateBlocked as exc:
        report_blocked(trial.COMMAND, args.json, exc)
        return EXIT_FAILED
    except NarwhalError as exc:  # a host or the record failed inside the trial: say whose
        _said(args, "failed", str(exc))
        return exc.exit_code
    except OSError as exc:  # a local port or file the trial needed
        _said(args, "failed", f"{type(exc).__name__}: {exc}")
        return EXIT_FAILED
    finally:
        ctx.close()
    valid = all(r["verdict"] in trial.VALID for r in doc["rates"])
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        _table(doc)
    return EXIT_OK if valid else EXIT_FAILED


def _trial(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    """The trial itself, recorded as one `load-trial` attempt."""
    sessions = ctx.sessions()
    router = router_alias(sessions)
    p = serve.plan(ctx.inputs, ctx.ledger, router)
    host = sessions.get(router)
    with ctx.ledger.attempt(trial.ACTIVITY, fingerprint={}, hosts={router: ["router"]},
                            deployment_revision=ctx.inputs.revision) as attempt:
        with attempt.bind(host):
            work = trial.Workload(trial.Size(args.requests, args.duration), args.seed,
                                  args.max_tokens, args.trace)
            doc = trial.run_trial(ctx.inputs, host, attempt, p, args.rates, work,
                                  Progress(args.json))
        doc["attempt"] = attempt.id
    return doc


def _table(doc: dict[str, Any]) -> None:
    table = Table(title=f"capacity trial {doc['attempt']} (SLO TTFT {doc['slo']['ttft_s']} s, "
                        f"TPOT {doc['slo']['tpot_s']} s)")
    for column in ("rate/s", "verdict", "attainment", "goodput/s", "TTFT p50/p99 s",
                   "TPOT p50/p99 s", "late sends", "client-limited", "reconciled"):
        table.add_column(column)
    for r in doc["rates"]:
        table.add_row(f"{r['rate']:g}", r["verdict"], f"{r['attainment']:.0%}",
                      f"{r['goodput_per_s']}", f"{r['ttft_p50_s']}/{r['ttft_p99_s']}",
                      f"{r['tpot_p50_s']}/{r['tpot_p99_s']}", str(r["late_sends"]),
                      str(r.get("client_limited", 0)), str(r["reconciled"]["ok"]))
    Console().print(table)
    Console().print(f"report: {doc['report']}")
