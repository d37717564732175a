"""The workload the fleet is sized for: optional, strictly read, and part of the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.cli.main import main
from narwhal.deploy.gates.registry import env_fingerprints
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs.fingerprints import input_values
from narwhal.deploy.inputs.template import TEMPLATE
from tests.envtext import valid_env

SOURCE = Path(".env")
VARIABLES = {
    "NARWHAL_WORKLOAD_PROMPT_TOKENS": ("prompt_tokens", "4096", 4096),
    "NARWHAL_WORKLOAD_HANDOFFS_PER_S": ("handoffs_per_s", "12.5", 12.5),
    "NARWHAL_WORKLOAD_BURST": ("burst", "3", 3),
    "NARWHAL_WORKLOAD_TRANSFER_BUDGET_MS": ("transfer_budget_ms", "250", 250.0),
    "NARWHAL_WORKLOAD_HEADROOM": ("headroom", "1.5", 1.5),
}
DEFAULTS = {"prompt_tokens": 1024, "handoffs_per_s": 1.0, "burst": 1,
            "transfer_budget_ms": 1000.0, "headroom": 1.25}
# Values no workload variable accepts, whatever its range.
BAD_EVERYWHERE = ["NaN", "nan", "inf", "-inf", "Infinity", "0", "-1", "-0.5", "fast", "1e400",
                  "1_0", "0x10", "\u0661", "1,5", " ", "true"]
BAD_FOR = {
    "NARWHAL_WORKLOAD_PROMPT_TOKENS": ["10000001", "1.5", "1e3", "99999999999999999999999"],
    "NARWHAL_WORKLOAD_BURST": ["0.99", "1.5", "100001"],
    "NARWHAL_WORKLOAD_HEADROOM": ["0.5"],
}
CASES = [(name, value) for name in VARIABLES for value in BAD_EVERYWHERE + BAD_FOR.get(name, [])]


def test_an_env_without_workload_variables_gets_the_documented_defaults() -> None:
    inputs = parse_inputs(valid_env(), SOURCE)
    assert inputs.workload.model_dump() == DEFAULTS
    for name, (attr, _, _) in VARIABLES.items():
        assert f"# {name}={_shown(DEFAULTS[attr])}\n" in TEMPLATE


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def test_the_templates_workload_lines_uncommented_are_the_defaults() -> None:
    lines = [line.removeprefix("# ") + "\n" for line in TEMPLATE.splitlines()
             if line.startswith("# NARWHAL_WORKLOAD_")]
    assert len(lines) == len(VARIABLES)
    assert parse_inputs(valid_env() + "".join(lines), SOURCE).workload.model_dump() == DEFAULTS


@pytest.mark.parametrize("name", VARIABLES)
def test_each_workload_variable_is_carried_on_inputs(name: str) -> None:
    attr, text, value = VARIABLES[name]
    inputs = parse_inputs(valid_env(**{name: text}), SOURCE)
    assert getattr(inputs.workload, attr) == value
    assert {k: v for k, v in inputs.workload.model_dump().items() if k != attr} == {
        k: v for k, v in DEFAULTS.items() if k != attr}


@pytest.mark.parametrize(("name", "value"), CASES)
def test_a_bad_workload_value_is_refused_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_inputs(valid_env(**{name: f"'{value}'"}), SOURCE)
    fields = [p.field for p in caught.value.problems]
    assert name in fields, caught.value.problems
    problem = caught.value.problems[fields.index(name)]
    assert "not a Narwhal variable" not in problem.problem  # refused for its value
    assert problem.fix  # every refusal says what to write instead


def test_every_bad_workload_value_is_reported_in_one_pass() -> None:
    bad = {name: "NaN" for name in VARIABLES}
    with pytest.raises(InputError) as caught:
        parse_inputs(valid_env(**bad), SOURCE)
    found = {p.field: p.problem for p in caught.value.problems}
    assert set(VARIABLES) <= set(found)
    assert all("NaN" in found[name] for name in VARIABLES), found  # refused for the value


@pytest.mark.parametrize("name", VARIABLES)
def test_a_changed_workload_moves_the_workload_fingerprint(name: str) -> None:
    before = env_fingerprints(parse_inputs(valid_env(), SOURCE))
    after = env_fingerprints(parse_inputs(valid_env(**{name: VARIABLES[name][1]}), SOURCE))
    assert before["fabric"]["workload"] != after["fabric"]["workload"]
    assert {k: v for k, v in before["fabric"].items() if k != "workload"} == {
        k: v for k, v in after["fabric"].items() if k != "workload"}


def test_the_workload_fingerprint_digests_the_values() -> None:
    assert input_values(parse_inputs(valid_env(), SOURCE))["workload"] == DEFAULTS


def test_inputs_json_shows_the_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    env = tmp_path / ".env"
    env.write_text(valid_env(NARWHAL_WORKLOAD_HANDOFFS_PER_S="40"))
    env.chmod(0o600)
    assert main(["inputs", "--env", str(env), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"] == {**DEFAULTS, "handoffs_per_s": 40.0}
    assert main(["inputs", "--env", str(env)]) == 0
    assert "40 handoffs/s" in capsys.readouterr().out
