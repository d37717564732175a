"""What `narwhal status` and `narwhal deploy` judge from: the record, the inputs now, what the
gates' measured inputs read, and what the live check finds on the hosts.

The rules are the gates' declarations (deploy/gates/registry.py), applied by
deploy/ledger/status.py; this module only reads what they need (the I/O at the edge).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from narwhal.core.errors import GateBlocked, HostError, LedgerError
from narwhal.deploy.actions.context import Context
from narwhal.deploy.gates import engines, live_check, restarts
from narwhal.deploy.gates.engines import INSTALL_PLAN
from narwhal.deploy.gates.handoff import passed_artifact, passed_attempt
from narwhal.deploy.gates.install import installed_tool
from narwhal.deploy.gates.live_check import Live
from narwhal.deploy.gates.runner import current_fingerprints
from narwhal.deploy.gates.spec import Finding, GateSpec
from narwhal.deploy.ledger.status import GateStatus, Judged, compute, moved_inputs


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


def judged(ctx: Context, specs: Mapping[str, GateSpec], doc: Mapping[str, Any],
           current: Mapping[str, Mapping[str, str]]) -> Judged:
    """Run the judges the specs declare: every passed gate's measured inputs, and the note on
    each moved verdict-only input that explains itself."""
    gates = doc.get("gates", {})
    measured: dict[str, str] = {}
    notes: dict[str, dict[str, str]] = {}
    for name, spec in specs.items():
        entry = gates.get(name, {})
        if entry.get("state") != "passed":
            continue
        for m in spec.measured:
            measured[name] = measured.get(name) or m.judge(ctx.inputs, ctx.ledger)
        moved = moved_inputs(entry.get("fingerprint", {}), current.get(name, {}))
        for key, judge in (spec.explain or {}).items():
            if key in moved:
                notes.setdefault(name, {})[key] = judge(ctx.inputs, ctx.ledger)
    return Judged({k: v for k, v in measured.items() if v}, notes)


@dataclass(frozen=True)
class Now:
    """What the gates are judged from at one moment, read once: the record, every gate's
    fingerprint now, and what the declared judges found. Rows with or without live findings
    are then computed from it without reading anything again."""

    specs: Mapping[str, GateSpec]
    doc: Mapping[str, Any]
    current: Mapping[str, Mapping[str, str]]
    judged: Judged

    def rows(self, findings: Sequence[Finding] = ()) -> dict[str, GateStatus]:
        """Gate -> its status, with `findings` (none: the record's own)."""
        rows = compute(self.specs, self.doc, self.current, replace(self.judged,
                                                                   findings=findings))
        return {r.gate: r for r in rows}


def read_now(ctx: Context, specs: Mapping[str, GateSpec]) -> Now:
    doc = ctx.ledger.load()
    current = current_fingerprints(specs, ctx.ledger, ctx.fingerprints(specs))
    return Now(specs, doc, current, judged(ctx, specs, doc, current))


def rows_now(ctx: Context, specs: Mapping[str, GateSpec],
             findings: Sequence[Finding] = ()) -> list[GateStatus]:
    """Every gate's status: its record, the inputs now, its measured inputs, and `findings`."""
    return list(read_now(ctx, specs).rows(findings).values())
