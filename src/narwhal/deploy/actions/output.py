"""What every gate command prints: progress lines on stderr, and a blocked verdict.

Progress goes to stderr so `--json` keeps stdout to one document; a blocked gate prints its
problems, each naming host, field and fix, as JSON or as lines.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from narwhal.core.errors import GateBlocked
from narwhal.core.gates import gate as gate_named
from narwhal.deploy.ledger import Ledger


class Progress:
    """One line per subject (host or engine) and step, with seconds since the command began."""

    def __init__(self, quiet: bool) -> None:
        self.console = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, subject: str, what: str) -> None:
        with self.lock:
            if not self.quiet:
                self.console.print(f"  [{time.monotonic() - self.t0:5.1f} s] {subject}: {what}")

    def say(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)


def blocked_document(gate: str, exc: GateBlocked) -> dict[str, Any]:
    """The blocked verdict as `--json` prints it."""
    return {"gate": gate, "verdict": "blocked", "cause": exc.cause,
            "problems": [{"field": p.field, "problem": p.problem, "fix": p.fix}
                         for p in exc.problems]}


def blocked_lines(gate: str, exc: GateBlocked, after: str = "") -> list[str]:
    """The blocked verdict as lines: the count, then every problem (or the cause)."""
    lines = [f"narwhal {gate}: blocked, {len(exc.problems) or 1} problem(s){after}:"]
    lines += [f"  - {p.line()}" for p in exc.problems] or [f"  - {exc.cause}"]
    return lines


def report_blocked(gate: str, as_json: bool, exc: GateBlocked, after: str = "") -> None:
    """The blocked verdict: one JSON document with --json, else every problem on stderr."""
    if as_json:
        print(json.dumps(blocked_document(gate, exc), indent=1))
        return
    for line in blocked_lines(gate, exc, after):
        print(line, file=sys.stderr)


def passed_document(gate: str, ledger: Ledger, shown: dict[str, Any]) -> dict[str, Any]:
    """The passed verdict as `--json` prints it: the attempt and what the gate shows."""
    return {"gate": gate, "verdict": "passed", "attempt": ledger.load()["gates"][gate]["last"],
            **shown}


def report_passed(gate: str, as_json: bool, ledger: Ledger, shown: dict[str, Any],
                  table: Callable[[], None]) -> None:
    """The passed verdict: one JSON document (the attempt and `shown`) with --json, else the
    gate's table and where its evidence is."""
    if as_json:
        print(json.dumps(passed_document(gate, ledger, shown), indent=1))
        return
    table()
    attempt = ledger.load()["gates"][gate]["last"]
    print(f"gate {_letter(gate)} passed: evidence in {ledger.attempt_folder(gate, attempt)}")


def _letter(gate: str) -> str:
    try:
        return gate_named(gate).letter
    except KeyError:
        return gate  # a gate outside the runbook's seven (a test's) is named by its name
