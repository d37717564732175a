"""A gate is its declaration: a new gate with one live input is followed by `narwhal status`,
by `narwhal deploy` and by its partial re-run with no edit anywhere but its own spec and
command (deploy/gates/registry.py's promise)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError, Problem
from narwhal.deploy.actions import deploy
from narwhal.deploy.actions.context import Context
from narwhal.deploy.actions.gate_commands import DeployFlags, GateCommand, Subjects
from narwhal.deploy.actions.output import Progress
from narwhal.deploy.actions.status import rows_now
from narwhal.deploy.gates.runner import run_gate
from narwhal.deploy.gates.spec import Finding, GateSpec, LiveRule, Partial, Reads, sequence
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt
from tests.envtext import valid_env

ALPHA = GateSpec("alpha", letter="X", inputs=("hosts",))
WIDGETS = GateSpec("widgets", letter="Y", reads=(Reads("alpha", "alpha.json"),),
                   live=(LiveRule("widget-bent", "widgets bent since built: "),),
                   clears=("widget-bent",),
                   partial=Partial((("widget-bent", "only"),), plan_key="only"))
SPECS = sequence(ALPHA, WIDGETS)
BENT = [Finding("widget-bent", "w2", "bent by a forklift")]


def _built(attempt: Attempt, alpha: bytes) -> dict[str, Any]:
    attempt.add_artifact("alpha.json", alpha)
    return {}


class Gates:
    """The two gates' functions; each records what it was asked to do."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []

    def alpha(self, ctx: Context, options: None, progress: Progress) -> dict[str, Any]:
        self.ran.append(("alpha", options))
        return run_gate(ALPHA, ctx.ledger, ctx.fingerprints(SPECS), {}, "", {"plan": 1},
                        lambda attempt: _built(attempt, b"{}\n"))

    def widgets(self, ctx: Context, only: tuple[str, ...] | None,
                progress: Progress) -> dict[str, Any]:
        self.ran.append(("widgets", only))
        plan = {"only": list(only)} if only else {"all": True}
        return run_gate(WIDGETS, ctx.ledger, ctx.fingerprints(SPECS), {}, "", plan,
                        lambda attempt: {"built": list(only or ["w1", "w2"])})


def _only(ctx: Context, flags: DeployFlags, subjects: Subjects
          ) -> tuple[tuple[str, ...] | None, list[str]]:
    only = tuple(subjects.get("only", ()))
    return only or None, ["widgets", *(["--only", ",".join(only)] if only else [])]


def _plan(gates: Gates) -> deploy.Plan:
    commands = {"alpha": GateCommand("alpha", gates.alpha, lambda r: None,
                                     lambda ctx, flags, subjects: (None, ["alpha"])),
                "widgets": GateCommand("widgets", gates.widgets, lambda r: None, _only)}
    return deploy.Plan(SPECS, commands, "widgets", DeployFlags(), as_json=True)


def _context(tmp_path: Path) -> Context:
    inputs = parse_inputs(valid_env(), Path(".env"))
    ledger = Ledger(tmp_path / "runs", inputs.deployment, inputs.secrets(), inputs.masked_env,
                    gates=list(SPECS))
    return Context(inputs, ledger, tmp_path / "runs", None)


def _seeing(found: list[Finding]) -> Any:
    return lambda ctx, plan, say: deploy.Observed({"exit": 0, "output": ""}, list(found))


def test_status_deploy_and_the_partial_rerun_follow_a_new_gates_declaration(
        tmp_path: Path) -> None:
    ctx, gates = _context(tmp_path), Gates()
    assert deploy.run(ctx, _plan(gates), _seeing([])) == 0
    assert gates.ran == [("alpha", None), ("widgets", None)]

    # status: the finding makes exactly the gate that declares its kind stale, named
    rows = {r.gate: r for r in rows_now(ctx, SPECS, BENT)}
    assert rows["alpha"].state == "passed"
    assert (rows["widgets"].state, rows["widgets"].reason) == (
        "stale", "widgets bent since built: w2")
    assert rows["widgets"].repeat == ("widgets",)
    assert {r.state for r in rows_now(ctx, SPECS)} == {"passed"}  # the record alone: fresh

    # deploy: alpha kept, widgets redone for w2 alone; its pass settles the finding
    gates.ran.clear()
    assert deploy.run(ctx, _plan(gates), _seeing(BENT)) == 0
    assert gates.ran == [("widgets", ("w2",))]
    last = ctx.ledger.load()["gates"]["widgets"]["last"]
    plan = (ctx.ledger.attempt_folder("widgets", last) / "plan.json").read_text()
    assert '"only"' in plan and '"w2"' in plan

    # an input it reads moved (alpha passed again with other output): the whole gate again
    gates.ran.clear()
    run_gate(ALPHA, ctx.ledger, ctx.fingerprints(SPECS), {}, "", {"plan": 2},
             lambda attempt: _built(attempt, b'{"moved": 1}\n'))
    assert deploy.run(ctx, _plan(gates), _seeing(BENT)) == 0
    assert gates.ran == [("widgets", None)]


def test_after_an_upstream_gate_reran_with_the_same_output_only_the_finding_is_redone(
        tmp_path: Path) -> None:
    """alpha's input moved, so alpha runs again; it writes the bytes widgets read before, so
    widgets' own inputs stand and only what the live check found is redone: staleness is
    read from fingerprints, never assumed."""
    ctx, gates = _context(tmp_path), Gates()
    assert deploy.run(ctx, _plan(gates), _seeing([])) == 0
    other = parse_inputs(valid_env(NARWHAL_NODE_1_SSH="root@10.213.0.99"), Path(".env"))
    moved = Context(other, ctx.ledger, ctx.runs, None)
    rows = {r.gate: r for r in rows_now(moved, SPECS, BENT)}
    assert rows["alpha"].reason == "input moved: hosts"
    assert rows["widgets"].repeat == ("widgets",)
    gates.ran.clear()
    assert deploy.run(moved, _plan(gates), _seeing(BENT)) == 0
    assert gates.ran == [("alpha", None), ("widgets", ("w2",))]


def test_a_gate_refused_before_any_attempt_gives_deploy_its_own_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A gate that stops on its inputs records no attempt; deploy's cause is then the gate's
    own `narwhal: ...` line, still shown on stderr, and stdout holds one JSON document."""
    ctx, gates = _context(tmp_path), Gates()

    def refuses(ctx: Context, options: None, progress: Progress) -> dict[str, Any]:
        raise InputError("--only", [Problem("--only", "w9 is not a widget", "name w1 or w2")])

    plan = _plan(gates)
    commands = {**plan.commands, "alpha": replace(plan.commands["alpha"], run=refuses)}
    assert deploy.run(ctx, replace(plan, commands=commands), _seeing([])) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["stopped_at"] == "alpha" and doc["cause"].startswith("narwhal: ")
    assert "w9 is not a widget" in doc["cause"] and "w9 is not a widget" in err
    assert doc["steps"][0]["exit"] == 2 and ctx.ledger.load()["gates"] == {}
