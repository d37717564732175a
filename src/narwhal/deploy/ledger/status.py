"""Gate states, computed from the gates' declarations alone (deploy/gates/registry.py).

This is the runbook's "Repeat work when its measured input changes" table: a passed gate is
stale when an input it declares moved since its pass (a `.env` input or an artifact it reads,
by fingerprint), when a measured input no longer holds for its record, or when the live check
found something of a kind it declares; what follows a stale gate is stale too, unless each
moved input only re-judges the gate's own measurements (`verdict_only`). Pure: the record, the
fingerprints now, and what was measured and found are the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from narwhal.deploy.gates.spec import Finding, GateSpec


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


@dataclass(frozen=True)
class Judged:
    """What was read besides fingerprints: per gate, why a measured input no longer holds
    (`measured`), and the note on a moved verdict-only input (`notes`, gate -> input -> note);
    and the live findings."""

    measured: Mapping[str, str] = field(default_factory=dict)
    notes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    findings: Sequence[Finding] = ()


def moved_inputs(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Names of inputs whose digest differs (or appeared/disappeared) since the gate passed."""
    return sorted(k for k in set(recorded) | set(current)
                  if k in recorded and recorded.get(k) != current.get(k))


def _passed(doc: Mapping[str, Any], name: str) -> bool:
    return bool(doc.get("gates", {}).get(name, {}).get("state") == "passed")


def _recorded(specs: Sequence[GateSpec], doc: Mapping[str, Any],
              current: Mapping[str, Mapping[str, str]] | None,
              judged: Judged) -> list[GateStatus]:
    """Every gate's row from the record: moved inputs, upstream staleness, measured inputs."""
    names = [s.name for s in specs]
    rows: list[GateStatus] = []
    upstream_stale = ""
    for spec in specs:
        entry = doc.get("gates", {}).get(spec.name, {})
        state, reason = entry.get("state", "pending"), entry.get("cause", "")
        repeat: tuple[str, ...] = ()
        propagates = True
        if state == "passed" and current is not None:
            moved = moved_inputs(entry.get("fingerprint", {}), current.get(spec.name, {}))
            if moved:
                state, reason = "stale", "input moved: " + ", ".join(moved)
                propagates = not set(moved) <= set(spec.verdict_only)
                notes = judged.notes.get(spec.name, {})
                reason += "".join(f" ({notes[k]})" for k in moved if k in notes)
            elif upstream_stale:
                state, reason = "stale", f"upstream gate {upstream_stale} is stale"
            elif judged.measured.get(spec.name):
                state, reason = "stale", judged.measured[spec.name]
        if state == "stale":
            later = names[names.index(spec.name):] if propagates else [spec.name]
            if propagates:
                upstream_stale = upstream_stale or spec.name
            repeat = tuple(g for g in later if _passed(doc, g))
        attempts = entry.get("attempts", [])
        rows.append(GateStatus(spec.name, spec.letter, state, len(attempts),
                               attempts[-1] if attempts else "", reason, repeat))
    return rows


def with_findings(specs: Mapping[str, GateSpec], rows: Sequence[GateStatus],
                  doc: Mapping[str, Any], findings: Sequence[Finding]) -> list[GateStatus]:
    """The rows with the live findings: a passed (or stale) gate that declares a kind found is
    stale naming what was found, and every later passed gate is to repeat with it."""
    names = list(specs)
    out, stale_from = [], ""
    for row in rows:
        cause = specs[row.gate].live_cause(findings)
        if cause and row.state in ("passed", "stale"):
            stale_from = stale_from or row.gate
            reason = cause if row.state == "passed" else f"{row.reason}; {cause}"
            row = replace(row, state="stale", reason=reason)
        if row.state == "stale" and stale_from:
            later = names[names.index(row.gate):]
            row = replace(row, repeat=tuple(g for g in later if _passed(doc, g) or g == row.gate))
        out.append(row)
    return out


def compute(specs: Mapping[str, GateSpec], doc: Mapping[str, Any],
            current: Mapping[str, Mapping[str, str]] | None,
            judged: Judged | None = None) -> list[GateStatus]:
    """Status rows for every gate, in order. `current` maps gate -> its fingerprint now (None:
    unknown, so only the recorded states)."""
    judged = judged or Judged()
    rows = _recorded(list(specs.values()), doc, current, judged)
    return with_findings(specs, rows, doc, judged.findings) if judged.findings else rows


def clear(specs: Mapping[str, GateSpec], gate: str,
          findings: Sequence[Finding]) -> list[Finding]:
    """The findings that still stand once `gate` passed: those of the kinds it settles go."""
    settled = set(specs[gate].clears)
    return [f for f in findings if f.kind not in settled]
