"""NARWHAL_KV_CANARY_INTERVAL_S: the live KV canary's period, strictly read, bounded as the
fleet's kv_canary.interval_s is, written by Gate F and part of Gate F's fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from narwhal.core.errors import InputError
from narwhal.core.fleet import KvCanaryRef
from narwhal.deploy.gates.preflight import CANARY, PreflightPlan, kv_canary
from narwhal.deploy.gates.registry import SPECS, env_fingerprints
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs.template import TEMPLATE
from narwhal.deploy.ledger.status import compute
from tests.envtext import valid_env
from tests.unit.inputs.passed_ledger import all_passed

SOURCE = Path(".env")
NAME = "NARWHAL_KV_CANARY_INTERVAL_S"
# Every one of these would reach the router as a period it refuses, or as none at all.
BAD = ["0", "-1", "-0.5", "0.09", "86400.5", "86401", "1e9", "1e400", "NaN", "nan", "inf",
       "-inf", "Infinity", "fast", "60s", "1_0", "0x10", "\u0661", "1,5", " ", "true"]


def test_unset_is_the_fleets_own_default_and_the_template_says_so() -> None:
    inputs = parse_inputs(valid_env(), SOURCE)
    assert inputs.kv_canary_interval_s == KvCanaryRef(path="x").interval_s == 60.0
    assert f"# {NAME}=60\n" in TEMPLATE
    line = f"{NAME}=60\n"  # the template's line, uncommented: the same default
    assert parse_inputs(valid_env() + line, SOURCE).kv_canary_interval_s == 60.0


@pytest.mark.parametrize(("text", "value"), [("3", 3.0), ("0.1", 0.1), ("86400", 86400.0),
                                             ("2.5", 2.5)])
def test_a_period_inside_the_fleets_bounds_is_carried(text: str, value: float) -> None:
    assert parse_inputs(valid_env(**{NAME: text}), SOURCE).kv_canary_interval_s == value
    assert KvCanaryRef(path="x", interval_s=value).interval_s == value  # the router takes it


@pytest.mark.parametrize("value", BAD)
def test_a_bad_period_is_refused_naming_the_variable_and_the_fix(value: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_inputs(valid_env(**{NAME: f"'{value}'"}), SOURCE)
    [problem] = [p for p in caught.value.problems if p.field == NAME]
    assert "not a Narwhal variable" not in problem.problem  # refused for its value
    assert "0.1 to 86400" in problem.fix and "default 60" in problem.fix, problem


@pytest.mark.parametrize("value", [0.0999, 86_400.5])
def test_the_env_bounds_are_the_fleets(value: float) -> None:
    """A period the .env refuses is one the router would refuse too (and none in between)."""
    with pytest.raises(ValidationError):
        KvCanaryRef(path="x", interval_s=value)
    with pytest.raises(InputError):
        parse_inputs(valid_env(**{NAME: repr(value)}), SOURCE)


def test_a_bad_period_is_reported_with_every_other_problem() -> None:
    with pytest.raises(InputError) as caught:
        parse_inputs(valid_env(**{NAME: "0", "NARWHAL_TTFT_S": "-1"}), SOURCE)
    assert {NAME, "NARWHAL_TTFT_S"} <= {p.field for p in caught.value.problems}


def test_a_moved_period_moves_gate_fs_canary_fingerprint_alone() -> None:
    before = env_fingerprints(parse_inputs(valid_env(), SOURCE))
    after = env_fingerprints(parse_inputs(valid_env(**{NAME: "3"}), SOURCE))
    moved = {(g, name) for g in before for name in before[g]
             if before[g][name] != after[g][name]}
    assert moved == {("preflight", "kv-canary")}
    same = env_fingerprints(parse_inputs(valid_env(**{NAME: "60.0"}), SOURCE))
    assert same == before  # the default written out is no change


def test_a_moved_period_repeats_preflight_and_serve_only() -> None:
    doc, now = all_passed()
    now["preflight"]["kv-canary"] = "kv-canary-2"
    rows = {r.gate: r for r in compute(SPECS, doc, now)}
    assert {g: r.state for g, r in rows.items() if r.state != "passed"} == {
        "preflight": "stale", "serve": "stale"}
    assert rows["preflight"].reason == "input moved: kv-canary"
    assert rows["preflight"].repeat == ("preflight", "serve")


def test_a_record_from_before_the_period_existed_is_not_stale_for_it() -> None:
    doc, now = all_passed()
    del doc["gates"]["preflight"]["fingerprint"]["kv-canary"]
    assert {r.state for r in compute(SPECS, doc, now)} == {"passed"}


def test_gate_f_writes_the_period_beside_the_reference() -> None:
    assert kv_canary(3.0) == {"path": CANARY, "interval_s": 3.0}
    fleet = {"engines": [{"id": "engine-1"}], "slo": {}, "profiles": {}}
    plan = PreflightPlan("router", {}, fleet, {}, canary_interval_s=3.0)
    assert plan.document()["kv_canary_interval_s"] == 3.0
    assert "kv_canary" not in plan.fleet  # narwhal-check's fleet names no reference yet
    KvCanaryRef.model_validate(kv_canary(3.0))  # what the router reads
