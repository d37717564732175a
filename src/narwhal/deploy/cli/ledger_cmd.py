"""`narwhal status`, `narwhal record export` and `narwhal recover <gate>`."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from narwhal.core.cli_common import EXIT_OK
from narwhal.core.errors import GateBlocked, HostError, LedgerError
from narwhal.core.gates import GATE_NAMES, gate
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.gates import engines, fabric, live_check, preflight, restarts
from narwhal.deploy.gates.engines import INSTALL_PLAN
from narwhal.deploy.gates.handoff import passed_artifact, passed_attempt
from narwhal.deploy.gates.install import installed_tool
from narwhal.deploy.gates.live_check import KV_PAIR_REPEAT, PROMETHEUS_REPEAT, ROUTER_REPEAT, Live
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.gates.runner import current_fingerprints
from narwhal.deploy.ledger.export import export
from narwhal.deploy.ledger.recover import recover
from narwhal.deploy.ledger.status import GateStatus, compute, with_live_changes

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


def read_live(ctx: Context) -> Live:
    """What moved that the record cannot see, read from the hosts (recorded as activity
    `status`): the attested engines (asked from the router host, the peer that relies on
    their sidecars), the router and Prometheus Gate G left serving, and the links Gate D
    measured (asked of both ends). Empty, with the reason, when the live check cannot run."""
    if restarts.attested_fleet(ctx.ledger) is None and passed_attempt(ctx.ledger, "fabric") is None:
        return Live()
    try:
        plan = passed_artifact(ctx.ledger, "status", INSTALL_PLAN).json()
    except (GateBlocked, LedgerError):
        return Live()
    sessions = ctx.sessions()
    alias = next(a for a, rs in sessions.roles().items() if "router" in rs)
    try:
        with ctx.ledger.attempt("status", fingerprint={}, hosts={alias: ["router"]},
                                deployment_revision=ctx.inputs.revision) as attempt:
            live = Live()
            router = sessions.get(alias)
            with attempt.bind(router):
                tool = installed_tool(router, str(plan["remote_dir"]), restarts.COMMAND)
                running = engines.running_probe(sessions, ctx.ledger, ctx.inputs, attempt)
                live.engines = restarts.changed_engines(ctx.ledger, router, tool, running)
                states = live_check.router_states(ctx.ledger, router, tool)
                live.router = live_check.router_down(ctx.ledger, router, tool, states)
                live.prometheus = live_check.prometheus_down(ctx.ledger, router, tool)
                live.kv_pairs = live_check.held_kv_pairs(states)
            live.links = live_check.moved_links(ctx.inputs, ctx.ledger, sessions, attempt)
            attempt.add_artifact("live-check.json", json.dumps(
                {"router_host": alias, **live.as_dict()}, indent=1).encode() + b"\n")
        return live
    except HostError as exc:
        return Live(skipped=f"live check skipped: {exc}")
    finally:
        ctx.close()


def recorded_rows(ctx: Context) -> list[GateStatus]:
    """Every gate's state from the record, the inputs' fingerprints now, and one measured
    input: the workload's prompt length held to the range Gate F's saved profiles measured
    (beyond it, Gate F is stale naming the rows to profile again). A moved workload makes Gate
    D stale alone (its samples are judged against the new budget; the note says which edges,
    if any, are measured again); inside the profiled range, nothing after it is repeated."""
    ledger = ctx.ledger
    doc = ledger.load()
    cover = ctx.inputs.workload.prompt_tokens
    gap = preflight.range_gap(ledger, cover) \
        if doc.get("gates", {}).get("preflight", {}).get("state") == "passed" else ""
    rows = compute(doc, current_fingerprints(SPECS, ledger, ctx.fingerprints()),
                   measured={"preflight": gap} if gap else None)
    out = []
    for row in rows:
        if row.gate == "fabric" and row.state == "stale" and "workload" in row.reason:
            note = fabric.rejudged(ctx.inputs, ledger)
            if not gap and doc.get("gates", {}).get("preflight", {}).get("state") == "passed":
                note += f"; every saved profile measured {cover}-token prompts: Gate F kept"
            row = replace(row, reason=f"{row.reason} ({note.lstrip('; ')})")
        out.append(row)
    return out


def with_live(ctx: Context, rows: list[GateStatus], live: Live) -> list[GateStatus]:
    """The rows with what the live check found moved (restarts.py, live_check.py)."""
    return with_live_changes(rows, ctx.ledger.load(), live.engines, live.router, live.links,
                             live.prometheus)


def run_status(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    ledger = ctx.ledger.ensure()
    live = Live() if args.offline else read_live(ctx)
    rows = with_live(ctx, recorded_rows(ctx), live)
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
