"""`narwhal deploy`: gates A to G in order, doing only the work that makes the fleet valid again.

First every physical host is reached as pinned (`narwhal hosts check`, the `access`
activity): a re-keyed or unreachable host stops the run before any gate, since a record that
says "fresh" cannot see it. Then, before each gate, the state is computed again from the record (and, once Gate E has passed,
from what the router host reads live from every attested engine's sidecar, asked once at the
start): a gate that is passed and fresh is kept, anything else (pending, stale, blocked,
failed) is run, through the very command an operator would type (`narwhal engines`, ...), so
its attempt, commands and evidence are recorded exactly as if run by hand, and its result is
in the record before the next gate is judged. A gate kept fresh because its inputs did not
move is not run again even when an earlier gate ran (Gate D after a recapture whose contract
came out byte-identical, for instance): staleness is read from fingerprints, never assumed.

An engine that only the live check found changed is captured again alone
(`narwhal engines --recapture ENGINE`), or, when its own host says it is not running (crashed,
or the host restarted), started again from its checked plan and captured
(`--restart ENGINE`); Gate E then replaces only its sidecar. A gate that
does not pass stops the run: its cause, where its evidence is, and how to go on.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from narwhal.core.cli_common import EXIT_FAILED, EXIT_OK
from narwhal.core.gates import GATES, Gate
from narwhal.core.gates import gate as gate_named
from narwhal.deploy.cli import ledger_cmd
from narwhal.deploy.cli.context import Context, add_common
from narwhal.deploy.gates.handoff import last_passed_attempt
from narwhal.deploy.gates.live_check import Live
from narwhal.deploy.gates.registry import SPECS
from narwhal.deploy.gates.restarts import EngineChange
from narwhal.deploy.gates.runner import current_fingerprints
from narwhal.deploy.ledger.status import GateStatus, moved_inputs


def gate_flag(text: str) -> Gate:
    try:
        return gate_named(text)
    except KeyError as exc:
        raise argparse.ArgumentTypeError(str(exc.args[0])) from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("deploy", help="gates A..G in order: run what is not passed and fresh, "
                                      "keep the rest")
    add_common(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--until", type=gate_flag, default=GATES[-1], metavar="GATE",
                   help="stop after this gate (name or letter; default G)")
    p.add_argument("--offline", action="store_true",
                   help="judge from the record only: do not ask the attested engines' "
                        "sidecars whether they still vouch")
    p.add_argument("--prepared", metavar="RUN", default=None,
                   help="gate B: install this prepared run (narwhal install --prepare-only)")
    p.add_argument("--wheelhouse", type=Path, default=None,
                   help="gate B: the folder holding runtime.lock's wheels")
    p.add_argument("--checkout", type=Path, default=None,
                   help="gate B: the git checkout holding the revision")
    p.add_argument("--fabric-seconds", type=int, default=None, metavar="SECONDS",
                   help="gate D: seconds per edge sample (default: gate D's own)")
    p.set_defaults(handler=run)


@dataclass
class Step:
    """One gate of this run: kept or run, and how it ended."""

    gate: Gate
    before: GateStatus
    action: str  # kept | ran
    argv: list[str]
    exit: int = EXIT_OK
    seconds: float = 0.0
    output: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {"gate": self.gate.name, "letter": self.gate.letter, "action": self.action,
                "state_before": self.before.state, "why": self.before.reason,
                "command": ["narwhal", *self.argv] if self.argv else [],
                "exit": self.exit, "seconds": round(self.seconds, 3), "output": self.output}


def _common(args: argparse.Namespace) -> list[str]:
    out = ["--env", str(args.env), "--runs", str(args.runs)]
    return out + (["--ssh-config", args.ssh_config] if args.ssh_config else [])


def gate_argv(gate: Gate, args: argparse.Namespace, partial: bool,
              changes: list[EngineChange],
              fabric_parameters: dict[str, Any] | None = None) -> list[str]:
    """The command line that runs `gate` now (without the common flags). `partial`: the
    gate's own inputs stand, so only what the live check found is redone.
    `fabric_parameters`: Gate D's last passed test parameters, kept unless
    `--fabric-seconds` says otherwise."""
    argv = [gate.command]
    if gate.name == "install":
        for flag, value in (("--prepared", args.prepared), ("--wheelhouse", args.wheelhouse),
                            ("--checkout", args.checkout)):
            if value is not None and not (flag == "--checkout" and args.prepared):
                argv += [flag, str(value)]
    if gate.name == "engines" and partial:
        # only the live check found these changed: capture them alone, and start again first
        # those that are not running at all
        recapture = [c.engine for c in changes if c.recapture and not c.restart]
        restart = [c.engine for c in changes if c.restart]
        argv += ["--recapture", ",".join(recapture)] if recapture else []
        argv += ["--restart", ",".join(restart)] if restart else []
    if gate.name == "fabric":
        # the test parameters are part of every link record: the ones the last pass measured
        # with, so that only the edges whose links moved are measured again
        kept = dict(fabric_parameters or {})
        if args.fabric_seconds is not None:
            kept["seconds"] = args.fabric_seconds
        for flag, key in (("--seconds", "seconds"), ("--omit", "omit_s"),
                          ("--parallel", "parallel"), ("--port", "port")):
            if isinstance(kept.get(key), int):
                argv += [flag, str(kept[key])]
    return argv


def fabric_parameters(ctx: Context) -> dict[str, Any] | None:
    """The test parameters Gate D's newest passed attempt measured with (its plan), or None.
    Newest passed, not the gate's state: after a blocked attempt (a shaped link) the edges
    that passed are reused only under the parameters they were measured with."""
    attempt = last_passed_attempt(ctx.ledger, "fabric")
    if attempt is None:
        return None
    try:
        plan = json.loads((ctx.ledger.attempt_folder("fabric", attempt) / "plan.json")
                          .read_text())
        return dict(plan["parameters"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def partial_ok(ctx: Context, row: GateStatus) -> bool:
    """Whether the gate may redo only part of its work: it is passed (only the live check
    found something), or its last attempt was itself partial (`--recapture`, `--restart`)
    and did not pass (or was recovered) while nothing the gate reads moved since its last
    pass (a restart stopped by a full disk, say: the other engines' captures still stand)."""
    if row.state == "passed":
        return True
    if row.state not in ("blocked", "failed", "pending") or not row.last:
        return False
    try:
        plan = json.loads((ctx.ledger.attempt_folder(row.gate, row.last) / "plan.json")
                          .read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(plan, dict) or "recapture" not in plan:
        return False
    passed_with = ctx.ledger.load()["gates"][row.gate].get("fingerprint", {})
    now = current_fingerprints(SPECS, ctx.ledger, ctx.fingerprints())[row.gate]
    return bool(passed_with) and not moved_inputs(passed_with, now)


def _rows(ctx: Context, live: Live) -> tuple[dict[str, GateStatus], dict[str, GateStatus]]:
    """(the record's states, the states with what the live check found) by gate."""
    plain = ledger_cmd.recorded_rows(ctx)
    return {r.gate: r for r in plain}, {r.gate: r for r in ledger_cmd.with_live(ctx, plain, live)}


def _run_command(argv: list[str], quiet: bool) -> tuple[int, Any]:
    """Run one narwhal command in this process; with `quiet`, its stdout (one JSON document
    with --json) is captured and parsed instead of printed."""
    from narwhal.deploy.cli.main import build_parser, run_handler  # main imports this module

    ns = build_parser().parse_args(argv)
    said = _Tee(sys.stderr)
    if not quiet:
        with contextlib.redirect_stderr(said):
            code = run_handler(ns)
        return code, _refusal(code, said)
    out = io.StringIO()
    with _stdout_fd_to_stderr(), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(said):
        code = run_handler(ns)
    try:
        return code, json.loads(out.getvalue())
    except ValueError:
        return code, out.getvalue()[-2000:] or _refusal(code, said)


class _Tee(io.StringIO):
    """stderr as it goes to the operator, also kept: a command refused before it recorded an
    attempt said why only there (`narwhal: <input error>`)."""

    def __init__(self, shown: Any) -> None:
        super().__init__()
        self._shown = shown

    def write(self, text: str) -> int:
        self._shown.write(text)
        return super().write(text[-4000:])


def _refusal(code: int, said: io.StringIO) -> str | None:
    """The command's own refusal (`narwhal: ...` and the problems under it), when it failed
    with one."""
    lines = said.getvalue().splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("narwhal")]
    if code == EXIT_OK or not starts:
        return None
    # the refusal's first line and the problems listed under it
    return " ".join(ln.strip() for ln in lines[starts[-1]:starts[-1] + 12])[:2000]


@contextlib.contextmanager
def _stdout_fd_to_stderr() -> Iterator[None]:
    """With --json, stdout holds one document: while a gate runs, file descriptor 1 points at
    stderr, so nothing a child process (ssh, a tool) writes there can land in it."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args)
    ctx.ledger.ensure()
    say = Console(stderr=True, highlight=False).print
    live = Live()
    access: dict[str, Any] = {}
    if not args.offline:
        # Every host first, as pinned: a re-keyed or unreachable host stops the run here, even
        # when every gate would be kept (the record alone cannot see it).
        say("access: every physical host over SSH, as pinned (`narwhal hosts check`)")
        code, output = _run_command(["hosts", "check", *_common(args)], args.json)
        access = {"exit": code, "output": output}
        if code != EXIT_OK:
            return _no_access(args, ctx, access, say)
        live = ledger_cmd.read_live(ctx)
        if live.skipped:
            say(f"[yellow]{live.skipped}[/]")
    last = GATES.index(args.until)
    steps: list[Step] = []
    t0 = time.monotonic()
    for number, gate in enumerate(GATES[:last + 1], 1):
        plain, now = _rows(ctx, live)
        row = now[gate.name]
        head = f"[{number}/{last + 1}] gate {gate.letter} {gate.name}"
        if row.state == "passed":
            say(f"{head}: passed and fresh, kept")
            steps.append(Step(gate, row, "kept", []))
            continue
        partial = gate.name == "engines" and bool(live.engines) and \
            partial_ok(ctx, plain[gate.name])
        argv = gate_argv(gate, args, partial, live.engines,
                         fabric_parameters(ctx) if gate.name == "fabric" else None)
        why = f" ({row.reason})" if row.reason else ""
        say(f"{head}: {row.state}{why}; running narwhal {' '.join(argv)}")
        started = time.monotonic()
        code, output = _run_command([*argv, *_common(args), *(["--json"] if args.json else [])],
                                    args.json)
        steps.append(Step(gate, row, "ran", argv, code, time.monotonic() - started, output))
        if code != EXIT_OK:
            return _stopped(args, ctx, steps, gate, say)
        if gate.name == "engines":
            live.engines = [replace(c, recapture=False, restart=False) for c in live.engines]
        if gate.name == "attest":
            live.engines = []  # every engine attested again as it runs now
        if gate.name == "preflight":
            live.links = []  # measured again (gate D), and the live KV paths exercised
        if gate.name == "serve":
            live.router = live.prometheus = ""  # adopted or started again, and checked
    return _finished(args, ctx, steps, time.monotonic() - t0, say,
                     "checked" if access else "skipped (--offline)")


def _no_access(args: argparse.Namespace, ctx: Context, access: dict[str, Any],
               say: Any) -> int:
    entry = ctx.ledger.load().get("activities", {}).get("access", {})
    folder = ctx.ledger.attempt_folder("access", entry["last"]) if entry.get("last") else \
        ctx.ledger.root
    fix = ("a host whose key changed: verify the new key out of band, then `narwhal hosts "
           "trust --replace ALIAS`; a host that does not answer: check it is up and reachable")
    if args.json:
        print(json.dumps({"deployment": ctx.ledger.deployment, "verdict": "stopped",
                          "stopped_at": "access", "cause": entry.get("cause", ""),
                          "hosts": access["output"], "fix": fix, "evidence": str(folder),
                          "steps": []}, indent=1))
    else:
        say("[red]narwhal deploy: stopped before gate A: not every host answers as pinned[/] "
            "(above, per host)")
        say(f"  evidence: {folder}")
        say(f"  fix: {fix}; then narwhal deploy")
    return EXIT_FAILED


def _stopped(args: argparse.Namespace, ctx: Context, steps: list[Step], gate: Gate,
             say: Any) -> int:
    entry = ctx.ledger.load()["gates"].get(gate.name, {})
    attempt = entry.get("last", "")
    folder = ctx.ledger.attempt_folder(gate.name, attempt) if attempt else ctx.ledger.root
    # a gate refused before it recorded an attempt (its inputs): its own words are the cause
    said = steps[-1].output if steps and isinstance(steps[-1].output, str) else ""
    cause = said if entry.get("state") == "passed" or not entry.get("cause") else \
        str(entry["cause"])
    if args.json:
        print(json.dumps({"deployment": ctx.ledger.deployment, "verdict": "stopped",
                          "stopped_at": gate.name, "cause": cause or "",
                          "evidence": str(folder), "steps": [s.as_dict() for s in steps],
                          "status": [r.as_dict() for r in ledger_cmd.recorded_rows(ctx)]}, indent=1))
    else:
        say(f"[red]narwhal deploy: stopped at gate {gate.letter} {gate.name}, "
            f"{entry.get('state', 'not passed')}[/]: {cause or 'see above'}")
        say(f"  evidence: {folder}")
        say(f"  inspect: narwhal status; after fixing the cause: narwhal deploy (gates "
            f"before {gate.letter} that are still fresh are kept); to undo what the attempt "
            f"created: narwhal recover {gate.name}")
    return EXIT_FAILED


def _finished(args: argparse.Namespace, ctx: Context, steps: list[Step], seconds: float,
              say: Any, access: str) -> int:
    rows = ledger_cmd.recorded_rows(ctx)
    if args.json:
        print(json.dumps({"deployment": ctx.ledger.deployment, "verdict": "passed",
                          "until": args.until.name, "seconds": round(seconds, 3),
                          "access": access,
                          "steps": [s.as_dict() for s in steps],
                          "status": [r.as_dict() for r in rows]}, indent=1))
        return EXIT_OK
    ran = [s for s in steps if s.action == "ran"]
    say(f"narwhal deploy: gates A..{args.until.letter} passed in {seconds:.1f} s; ran "
        f"{', '.join(s.gate.letter for s in ran) or 'nothing'}, kept "
        f"{', '.join(s.gate.letter for s in steps if s.action == 'kept') or 'nothing'}")
    for s in ran:
        say(f"  gate {s.gate.letter} {s.gate.name}: {s.seconds:.1f} s")
    return EXIT_OK
