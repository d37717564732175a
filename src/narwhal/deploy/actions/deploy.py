"""`narwhal deploy`: the gates in order, doing only the work that makes the fleet valid again.

First every physical host is reached as pinned (`narwhal hosts check`, the `access`
activity). Then, before each gate, the state is computed again from the record and the gates'
declarations (deploy/gates/registry.py), with what the live check found (asked once at the
start): a gate that is passed and fresh is kept; anything else (pending, stale, blocked,
failed) is run through the very function its command runs, so its attempt, commands and
evidence are recorded exactly as by hand, and its result is in the record before the next
gate is judged. A gate stale only through live findings that its spec can redo in part (an
engine restarted: capture it alone) gets the findings' subjects; its pass settles the kinds it
declares. A gate that does not pass stops the run: its cause, its evidence, how to go on.
There is no gate's name in this module.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.errors import GateBlocked, NarwhalError
from narwhal.deploy.actions import report
from narwhal.deploy.actions.access import check_hosts
from narwhal.deploy.actions.context import Context
from narwhal.deploy.actions.gate_commands import DeployFlags, GateCommand
from narwhal.deploy.actions.output import (
    Progress,
    blocked_document,
    blocked_lines,
    passed_document,
    report_passed,
)
from narwhal.deploy.actions.status import Now, read_live, read_now
from narwhal.deploy.gates.handoff import attempt_plan
from narwhal.deploy.gates.live_check import findings
from narwhal.deploy.gates.spec import Finding, GateSpec
from narwhal.deploy.ledger.status import GateStatus, clear, moved_inputs

Say = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """What one `narwhal deploy` runs: the gates (in order) through `until`, and how."""

    specs: Mapping[str, GateSpec]
    commands: Mapping[str, GateCommand[Any]]
    until: str
    flags: DeployFlags
    as_json: bool = False
    offline: bool = False


@dataclass
class Step:
    """One gate of this run: kept or run, and how it ended."""

    spec: GateSpec
    before: GateStatus
    action: str  # kept | ran
    argv: list[str]
    exit: int = EXIT_OK
    seconds: float = 0.0
    output: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {"gate": self.spec.name, "letter": self.spec.letter, "action": self.action,
                "state_before": self.before.state, "why": self.before.reason,
                "command": ["narwhal", *self.argv] if self.argv else [],
                "exit": self.exit, "seconds": round(self.seconds, 3), "output": self.output}


def partial_ok(ctx: Context, now: Now, row: GateStatus) -> bool:
    """Whether the gate may redo only part of its work: it is passed (only the live check
    found something), or its last attempt was itself partial and did not pass (or was
    recovered) while nothing the gate reads moved since its last pass (a restart stopped by a
    full disk, say: the other engines' captures still stand)."""
    partial = now.specs[row.gate].partial
    if partial is None:
        return False
    if row.state == "passed":
        return True
    if row.state not in ("blocked", "failed", "pending") or not row.last:
        return False
    plan = attempt_plan(ctx.ledger, row.gate, row.last)
    if plan is None or partial.plan_key not in plan:
        return False
    passed_with = now.doc["gates"][row.gate].get("fingerprint", {})
    return bool(passed_with) and not moved_inputs(passed_with, now.current[row.gate])


def subjects(ctx: Context, now: Now, gate: str,
             found: Sequence[Finding]) -> Mapping[str, Sequence[str]]:
    """The subjects the gate redoes alone ({} for all of its work): a partial re-run is judged
    on the record's own row, without the live findings that call for it."""
    partial = now.specs[gate].partial
    named = partial.subjects(found) if partial else {}
    return named if named and partial_ok(ctx, now, now.rows()[gate]) else {}


def _refusal(lines: Sequence[str]) -> str:
    """A refusal as deploy records it: its first line and the problems under it."""
    return " ".join(ln.strip() for ln in lines[:12])[:2000]


def run_step(ctx: Context, plan: Plan, command: GateCommand[Any], options: Any
             ) -> tuple[int, Any]:
    """Run one gate's function as its command would, reporting as it would; (exit, what
    deploy records of its output: the `--json` document, or the refusal in its words)."""
    progress = Progress(plan.as_json)
    err = sys.stderr
    try:
        result = command.run(ctx, options, progress)
    except GateBlocked as exc:
        lines = blocked_lines(command.name, exc, command.blocked_after)
        if plan.as_json:
            return EXIT_FAILED, blocked_document(command.name, exc)
        print("\n".join(lines), file=err)
        return EXIT_FAILED, _refusal(lines)
    except NarwhalError as exc:
        said = f"narwhal: {exc}"
        print(said, file=err)
        return exc.exit_code, _refusal(said.splitlines())
    except Exception:
        traceback.print_exc()
        said = "narwhal: this is a bug in Narwhal; please report it with the trace above"
        print(said, file=err)
        return EXIT_FAILED, said
    shown = command.shown(result)
    if plan.as_json:
        return EXIT_OK, passed_document(command.name, ctx.ledger, shown)
    report_passed(command.name, False, ctx.ledger, shown, lambda: command.table(result))
    return EXIT_OK, None


def access(ctx: Context, plan: Plan, say: Say) -> dict[str, Any]:
    """Every host first, as pinned; what deploy records of it."""
    say("access: every physical host over SSH, as pinned (`narwhal hosts check`)")
    lines: list[str] = []

    def line(text: str) -> None:
        lines.append(text)
        if not plan.as_json:
            print(text)
    try:
        code = check_hosts(ctx, line)
    except NarwhalError as exc:
        print(f"narwhal: {exc}", file=sys.stderr)
        code = exc.exit_code
    said = "".join(f"{text}\n" for text in lines)[-2000:]
    return {"exit": code, "output": said if plan.as_json else None}


@dataclass(frozen=True)
class Observed:
    """What deploy learnt before the first gate: the access check as recorded ({}: not asked,
    --offline) and the live findings."""

    access: dict[str, Any]
    findings: list[Finding]


def observe(ctx: Context, plan: Plan, say: Say) -> Observed | None:
    """Every host as pinned, then the live check (none with --offline); None when a host does
    not answer as pinned (reported: the run stops before any gate)."""
    if plan.offline:
        return Observed({}, [])
    checked = access(ctx, plan, say)
    if checked["exit"] != EXIT_OK:
        report.no_access(ctx, plan.as_json, checked, say)
        return None
    live = read_live(ctx)
    if live.skipped:
        say(f"[yellow]{live.skipped}[/]")
    return Observed(checked, findings(live))


def run(ctx: Context, plan: Plan,
        look: Callable[[Context, Plan, Say], Observed | None] = observe) -> int:
    """Deploy through `plan.until`; the exit code."""
    ctx.ledger.ensure()
    say = Console(stderr=True, highlight=False).print
    observed = look(ctx, plan, say)
    if observed is None:
        return EXIT_FAILED
    order = list(plan.specs)
    gates = order[:order.index(plan.until) + 1]
    found, steps, t0 = observed.findings, [], time.monotonic()
    for number, name in enumerate(gates, 1):
        spec = plan.specs[name]
        now = read_now(ctx, plan.specs)
        row = now.rows(found)[name]
        head = f"[{number}/{len(gates)}] gate {spec.letter} {name}"
        if row.state == "passed":
            say(f"{head}: passed and fresh, kept")
            steps.append(Step(spec, row, "kept", []))
            continue
        named = subjects(ctx, now, name, found)
        options, argv = plan.commands[name].deploy_options(ctx, plan.flags, named)
        why = f" ({row.reason})" if row.reason else ""
        say(f"{head}: {row.state}{why}; running narwhal {' '.join(argv)}")
        started = time.monotonic()
        code, output = run_step(ctx, plan, plan.commands[name], options)
        steps.append(Step(spec, row, "ran", argv, code, time.monotonic() - started, output))
        if code != EXIT_OK:
            return report.stopped(ctx, plan, steps, say)
        found = clear(plan.specs, name, found)
    return report.finished(ctx, plan, steps, time.monotonic() - t0, say,
                           "checked" if observed.access else "skipped (--offline)")
