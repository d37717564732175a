"""NARWHAL_WORKLOAD_TRANSFER_BUDGET_MS reaches the router: Gate F writes it into the fleet as
`serving.handoff_budget_s`, from which the router derives a handoff's first-byte deadline, and
a moved budget repeats Gates F and G (Gate D only re-judges its samples)."""

from __future__ import annotations

from pathlib import Path

from narwhal.core.fleet import HANDOFF_BUDGET_MAX_S, Serving
from narwhal.deploy.gates.preflight import handoff_budget_s
from narwhal.deploy.gates.registry import SPECS, env_fingerprints
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.ledger.status import compute
from tests.envtext import valid_env
from tests.unit.inputs.passed_ledger import all_passed

SOURCE = Path(".env")
NAME = "NARWHAL_WORKLOAD_TRANSFER_BUDGET_MS"


def test_the_budget_reaches_the_fleet_in_seconds_within_what_the_router_accepts() -> None:
    assert handoff_budget_s(1000.0) == 1.0
    assert handoff_budget_s(250.0) == 0.25
    assert handoff_budget_s(1e12) == HANDOFF_BUDGET_MAX_S  # the router caps deadlines anyway
    for ms in (0.001, 1000.0, 1e12):
        Serving(handoff_budget_s=handoff_budget_s(ms))  # what the router validates


def test_a_moved_budget_moves_the_fabric_s_workload_and_gate_f_s_handoff_budget() -> None:
    before = env_fingerprints(parse_inputs(valid_env(), SOURCE))
    after = env_fingerprints(parse_inputs(valid_env(**{NAME: "250"}), SOURCE))
    moved = {(g, name) for g in before for name in before[g]
             if before[g][name] != after[g][name]}
    assert moved == {("fabric", "workload"), ("preflight", "handoff-budget")}
    assert "workload" in SPECS["fabric"].verdict_only


def test_a_moved_budget_repeats_preflight_and_serve_and_a_record_before_it_is_not_stale() -> None:
    doc, now = all_passed()
    now["preflight"]["handoff-budget"] = "handoff-budget-2"
    rows = {r.gate: r for r in compute(SPECS, doc, now)}
    assert {g: r.state for g, r in rows.items() if r.state != "passed"} == {
        "preflight": "stale", "serve": "stale"}
    assert rows["preflight"].reason == "input moved: handoff-budget"
    doc, now = all_passed()
    del doc["gates"]["preflight"]["fingerprint"]["handoff-budget"]
    assert {r.state for r in compute(SPECS, doc, now)} == {"passed"}
