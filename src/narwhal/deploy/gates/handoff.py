"""Artifact hand-off: "the passed attempt of gate X, artifact Y", through one ledger call.

A gate never reads another gate's files by path. It asks for the artifact of the gate's last
passed attempt; the digest recorded in that attempt's `attempt.json` is checked against the
bytes on disk (evidence is written once; a changed file is a broken record, not an input), and
the digest joins the reading gate's fingerprint, so when the upstream gate passes again with
different output the reading gate becomes stale.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core.documents import sha256_bytes
from narwhal.core.errors import GateBlocked, LedgerError
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.ledger import Ledger


@dataclass(frozen=True)
class Artifact:
    gate: str
    name: str
    attempt: str
    path: Path
    sha256: str

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def json(self) -> Any:
        return json.loads(self.read_bytes())


def passed_attempt(ledger: Ledger, gate: str) -> str | None:
    """The id of the gate's last passed attempt, or None."""
    if not ledger.exists():
        return None
    entry = ledger.load().get("gates", {}).get(gate, {})
    if entry.get("state") != "passed":
        return None
    last = entry.get("last") or (entry.get("attempts") or [""])[-1]
    return str(last) or None


def last_passed_attempt(ledger: Ledger, gate: str) -> str | None:
    """The gate's newest attempt that passed, even when a later one did not (a partial
    attempt that failed: what it would have replaced still stands). None when none passed."""
    if not ledger.exists():
        return None
    entry = ledger.load().get("gates", {}).get(gate, {})
    if entry.get("state") == "passed":
        return passed_attempt(ledger, gate)
    for attempt in reversed(entry.get("attempts") or []):
        try:
            doc = json.loads((ledger.attempt_folder(gate, attempt) / "attempt.json")
                             .read_text())
        except (OSError, ValueError):
            continue  # still running, or cut off before it finished: not passed
        if doc.get("verdict") == "passed":
            return str(attempt)
    return None


def _recorded(ledger: Ledger, gate: str, through_failures: bool = False
              ) -> tuple[str, dict[str, str]] | None:
    """The gate's last passed attempt and the artifact digests its attempt.json recorded."""
    attempt = last_passed_attempt(ledger, gate) if through_failures else \
        passed_attempt(ledger, gate)
    if attempt is None:
        return None
    folder = ledger.attempt_folder(gate, attempt)
    try:
        artifacts = json.loads((folder / "attempt.json").read_text())["artifacts"]
    except (OSError, ValueError, KeyError) as exc:
        raise LedgerError(f"{folder}/attempt.json is unreadable ({exc})") from None
    return attempt, dict(artifacts)


def passed_artifact(ledger: Ledger, reader: str, read: Reads, *,
                    through_failures: bool = False) -> Artifact:
    """The artifact, verified; GateBlocked (for `reader`) when the upstream gate has not passed.
    `through_failures`: from the newest attempt that passed even if a later one did not (only
    a gate re-doing part of its own work reads its own record this way)."""
    recorded = _recorded(ledger, read.gate, through_failures)
    if recorded is None:
        raise GateBlocked(reader, f"gate {read.gate} has not passed; run `narwhal {read.gate}` "
                                  f"first (this gate reads its {read.artifact})")
    attempt, artifacts = recorded
    sha = artifacts.get(read.artifact)
    if sha is None:
        raise LedgerError(f"gate {read.gate} attempt {attempt} recorded no artifact "
                          f"{read.artifact!r} (it has: {', '.join(sorted(artifacts)) or 'none'})")
    path = ledger.attempt_folder(read.gate, attempt) / read.artifact
    if sha256_bytes(path.read_bytes()) != sha:
        raise LedgerError(f"{path} no longer matches the sha256 recorded when it was written; "
                          "the deployment record was edited: restore it or run the gate again")
    return Artifact(read.gate, read.artifact, attempt, path, sha)


def read_digests(ledger: Ledger, reads: tuple[Reads, ...]) -> dict[str, str]:
    """Fingerprint entries for what a gate reads now (an upstream not passed: no entry)."""
    out: dict[str, str] = {}
    for read in reads:
        recorded = _recorded(ledger, read.gate)
        sha = recorded[1].get(read.artifact) if recorded is not None else None
        if sha:
            out[read.key] = sha
    return out


def attempt_plan(ledger: Ledger, gate: str, attempt: str) -> dict[str, Any] | None:
    """The plan an attempt recorded before it ran (its plan.json), or None when there is no
    readable JSON object there: what a gate planned, read back to judge what it may redo."""
    try:
        plan = json.loads((ledger.attempt_folder(gate, attempt) / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None
