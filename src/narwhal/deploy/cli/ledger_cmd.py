"""`narwhal status`, `narwhal record export` and `narwhal recover <gate>`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_OK
from narwhal.core.gates import GATE_NAMES, gate
from narwhal.deploy.actions.context import Context, add_common
from narwhal.deploy.actions.status import read_live, rows_now
from narwhal.deploy.gates.live_check import (
    KV_PAIR_REPEAT,
    PROMETHEUS_REPEAT,
    ROUTER_REPEAT,
    Live,
    findings,
)
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.ledger.export import export
from narwhal.deploy.ledger.recover import recover

STATE_STYLE = {"passed": "green", "stale": "yellow", "blocked": "red", "failed": "red",
               "running": "cyan", "pending": "dim"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser("status", help="every gate: passed, blocked, stale (and why), pending")
    add_common(status)
    status.add_argument("--json", action="store_true")
    status.add_argument("--offline", action="store_true",
                        help="the record only: do not ask the attested engines' sidecars "
                             "(from the router host) whether they still vouch")
    status.set_defaults(handler=run_status)

    record = sub.add_parser("record", help="the deployment record")
    record_sub = record.add_subparsers(dest="record_command", metavar="ACTION")
    record_sub.required = True
    exp = record_sub.add_parser("export", help="copy the record with private values aliased")
    add_common(exp)
    exp.add_argument("--out", type=Path, default=None, help="a new folder for the export")
    exp.set_defaults(handler=run_export)

    rec = sub.add_parser("recover", help="remove exactly what a failed attempt created")
    add_common(rec)
    rec.add_argument("gate", help="gate name or letter, e.g. engines or C")
    rec.add_argument("--attempt", default=None, help="attempt id (default: the last one)")
    rec.set_defaults(handler=run_recover)


def run_status(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    ledger = ctx.ledger.ensure()
    live = Live() if args.offline else read_live(ctx)
    rows = rows_now(ctx, SPECS, findings(live))
    if args.json:
        print(json.dumps({"deployment": ledger.deployment,
                          "gates": [r.as_dict() for r in rows], **live.as_dict(),
                          "live_check": "off" if args.offline else (live.skipped or "done")},
                         indent=2))
        return EXIT_OK
    table = Table(title=f"deployment {ledger.deployment}")
    for column in ("gate", "state", "attempts", "last attempt", "why / what to repeat"):
        table.add_column(column)
    for row in rows:
        why = row.reason + (f" → repeat: {', '.join(row.repeat)}" if row.repeat else "")
        style = STATE_STYLE.get(row.state, "")
        table.add_row(f"{row.letter} {row.gate}", f"[{style}]{row.state}[/]", str(row.attempts),
                      row.last or "-", why or "")
    console = Console()
    console.print(table)
    if live.engines:
        console.print(_table("engines that are not what gate E attested (read from the router "
                             "host)", ("engine", "why", "repeat, in order"),
                             [(c.engine, c.reason, "\n".join(c.repeat)) for c in live.engines]))
    if live.links:
        console.print(_table("directed links that moved since gate D measured them (read from "
                             "both ends)", ("edge", "what moved", "repeat, in order"),
                             [(c.edge, ", ".join(c.moved), "\n".join(c.repeat))
                              for c in live.links]))
    if live.kv_pairs:
        console.print(_table("KV pairs the router's live canary holds out of placement",
                             ("pair", "verdict", "evidence", "repeat, in order"),
                             [(p["pair"], p["verdict"], p["evidence"],
                               "\n".join(KV_PAIR_REPEAT)) for p in live.kv_pairs]))
    if live.router:
        console.print(f"[yellow]router: {live.router}[/]; repeat: {ROUTER_REPEAT[0]}")
    if live.prometheus:
        console.print(f"[yellow]prometheus: {live.prometheus}[/]; repeat: "
                      f"{PROMETHEUS_REPEAT[0]}")
    if live.skipped:
        console.print(f"[yellow]{live.skipped}[/]")
    return EXIT_OK


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


def run_export(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or Path(f"export-{ctx.inputs.deployment}-{stamp}")
    manifest = export(ctx.ledger, ctx.inputs, out)
    kinds = {k: len(v) for k, v in manifest["aliases"].items() if v}
    print(f"exported {len(manifest['files'])} files to {out}; aliased {kinds or 'nothing'}; "
          f"see {out}/export-manifest.json")
    return EXIT_OK


def _owned_name(item: dict[str, Any]) -> str:
    """How an owned item is named in the recovery report."""
    if item.get("kind") == "container":
        return f"{item.get('runtime')} {str(item.get('id', ''))[:12]}"
    return str(item.get("path") or f"pid {item.get('pid')} ({item.get('argv0', '')})")


def run_recover(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    try:
        name = gate(args.gate).name
    except KeyError as exc:
        if args.gate not in GATE_NAMES and args.gate != "access":
            print(f"narwhal recover: {exc.args[0]}")
            return 2
        name = args.gate
    sessions = ctx.sessions()
    try:
        report = recover(ctx.ledger, name, sessions.get, args.attempt)
    finally:
        ctx.close()
    for item in report:
        print(f"{item['host']}: {item['kind']} {_owned_name(item)}: {item['result']}")
    print(f"gate {name}: recovered; the failed attempt's evidence is kept")
    return EXIT_OK
