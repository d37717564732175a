"""What every gate command prints: progress lines on stderr, and a blocked verdict.

Progress goes to stderr so `--json` keeps stdout to one document; a blocked gate prints its
problems, each naming host, field and fix, as JSON or as lines.
"""

from __future__ import annotations

import argparse
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


def report_blocked(gate: str, args: argparse.Namespace, exc: GateBlocked,
                   after: str = "") -> None:
    """The blocked verdict: one JSON document with --json, else every problem on stderr."""
    if args.json:
        print(json.dumps({"gate": gate, "verdict": "blocked", "cause": exc.cause,
                          "problems": [{"field": p.field, "problem": p.problem, "fix": p.fix}
                                       for p in exc.problems]}, indent=1))
        return
    print(f"narwhal {gate}: blocked, {len(exc.problems) or 1} problem(s){after}:",
          file=sys.stderr)
    for p in exc.problems:
        print(f"  - {p.line()}", file=sys.stderr)
    if not exc.problems:
        print(f"  - {exc.cause}", file=sys.stderr)


def report_passed(gate: str, args: argparse.Namespace, ledger: Ledger, shown: dict[str, Any],
                  table: Callable[[], None]) -> None:
    """The passed verdict: one JSON document (the attempt and `shown`) with --json, else the
    gate's table and where its evidence is."""
    attempt = ledger.load()["gates"][gate]["last"]
    if args.json:
        print(json.dumps({"gate": gate, "verdict": "passed", "attempt": attempt, **shown},
                         indent=1))
        return
    table()
    print(f"gate {gate_named(gate).letter} passed: evidence in "
          f"{ledger.attempt_folder(gate, attempt)}")
