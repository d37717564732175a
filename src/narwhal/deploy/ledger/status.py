"""Gate states, computed: passed gates whose inputs moved are stale, and so is what follows.

This is the runbook's "Repeat work when its measured input changes" table, derived from the
recorded fingerprints instead of remembered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from narwhal.core.gates import GATE_NAMES, GATES, VERDICT_ONLY


@dataclass(frozen=True)
class GateStatus:
    gate: str
    letter: str
    state: str          # pending | running | passed | failed | blocked | stale
    attempts: int
    last: str
    reason: str
    repeat: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "letter": self.letter, "state": self.state,
                "attempts": self.attempts, "last_attempt": self.last, "reason": self.reason,
                "repeat": list(self.repeat)}


def moved_inputs(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """Names of inputs whose digest differs (or appeared/disappeared) since the gate passed."""
    return sorted(k for k in set(recorded) | set(current)
                  if k in recorded and recorded.get(k) != current.get(k))


def compute(doc: dict[str, Any], current: dict[str, dict[str, str]] | None,
            measured: Mapping[str, str] | None = None) -> list[GateStatus]:
    """Status rows for every gate. `current` maps gate -> its fingerprint now (None: unknown).
    `measured` maps gate -> why a measured input no longer holds for its passed record (a
    workload beyond Gate F's profiled range, say): that gate is stale as for a moved input."""
    rows: list[GateStatus] = []
    upstream_stale = ""
    for gate in GATES:
        entry = doc.get("gates", {}).get(gate.name, {})
        state = entry.get("state", "pending")
        reason = entry.get("cause", "")
        repeat: tuple[str, ...] = ()
        propagates = True
        if state == "passed" and current is not None:
            moved = moved_inputs(entry.get("fingerprint", {}), current.get(gate.name, {}))
            if moved:
                state, reason = "stale", "input moved: " + ", ".join(moved)
                # only re-judging its own measurements: what later gates read stands
                propagates = not set(moved) <= set(VERDICT_ONLY.get(gate.name, ()))
            elif upstream_stale:
                state, reason = "stale", f"upstream gate {upstream_stale} is stale"
            elif measured and gate.name in measured:
                state, reason = "stale", measured[gate.name]
        if state == "stale":
            later = GATE_NAMES[GATE_NAMES.index(gate.name):]
            if propagates:
                upstream_stale = upstream_stale or gate.name
            else:
                later = (gate.name,)
            repeat = tuple(g for g in later
                           if doc.get("gates", {}).get(g, {}).get("state") == "passed")
        attempts = entry.get("attempts", [])
        rows.append(GateStatus(gate.name, gate.letter, state, len(attempts),
                               attempts[-1] if attempts else "", reason, repeat))
    return rows


def with_live_changes(rows: list[GateStatus], doc: dict[str, Any],
                      changes: Sequence[Any], router: str = "",
                      links: Sequence[Any] = (), prometheus: str = "") -> list[GateStatus]:
    """The rows with what the live check found: an engine that must be captured again makes
    Gate C stale, any engine its sidecar no longer vouches for makes Gate E stale, each naming
    the engines; a directed link that moved makes Gate D stale, naming the edges, and the full
    preflight (Gate F) is repeated after it; a router that does not answer, or a Prometheus
    that is gone or does not answer (the fleet unwatched), makes Gate G stale, naming which.
    The later passed gates are to repeat, as for a moved input."""
    if not changes and not router and not links and not prometheus:
        return rows
    causes: dict[str, str] = {}
    if changes:
        causes["attest"] = "not attested now: " + "; ".join(f"{c.engine}: {c.reason}"
                                                            for c in changes)
    recapture = [c.engine for c in changes if c.recapture and not c.restart]
    down = [c.engine for c in changes if c.restart]
    said = [f"restarted since captured: {', '.join(recapture)}"] if recapture else []
    said += [f"not running, to start again: {', '.join(down)}"] if down else []
    if said:
        causes["engines"] = "; ".join(said)
    if links:
        causes["fabric"] = "link moved since measured: " + "; ".join(
            f"{c.edge} ({', '.join(c.moved)})" for c in links)
        causes["preflight"] = "the live KV paths over the moved links are to be exercised"
    serve = [f"router not serving: {router}"] if router else []
    serve += [f"prometheus not serving: {prometheus}; `narwhal serve` (or `narwhal deploy`) "
              "starts it again"] if prometheus else []
    if serve:
        causes["serve"] = "; ".join(serve)
    out, stale_from = [], ""
    for row in rows:
        if row.gate in causes and row.state in ("passed", "stale"):
            stale_from = stale_from or row.gate
            reason = causes[row.gate] if row.state == "passed" else \
                f"{row.reason}; {causes[row.gate]}"
            row = replace(row, state="stale", reason=reason)
        if row.state == "stale" and stale_from:
            later = GATE_NAMES[GATE_NAMES.index(row.gate):]
            row = replace(row, repeat=tuple(g for g in later if doc.get("gates", {})
                                            .get(g, {}).get("state") == "passed"
                                            or g == row.gate))
        out.append(row)
    return out
