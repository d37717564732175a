"""The `.env`'s credentials reach what enforces them: the router's tenant key and vLLM's API key
travel as 0600 files named by the fleet and the launch record, never as values in a document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.core.fleet import parse_fleet
from narwhal.core.launch_record import ENGINE_API_KEY_ENV
from narwhal.deploy.gates.discover_checks import EnginePlan
from narwhal.deploy.gates.generated import fleet_draft, launch_record
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.package.rolefiles import role_files
from tests.envtext import valid_env

ROUTER_KEY = "sk-router-" + "r" * 24
HF = "hf_" + "h" * 30


def _plan(inputs: Inputs, n: int = 0) -> EnginePlan:
    plan = EnginePlan(inputs.engines[n], f"node-{n + 1}")
    plan.fabric_address, plan.accelerator = f"10.0.0.{5 + n}", "none"
    plan.image, plan.model = {"id": "sha256:" + "a" * 64}, {"model_tree_sha256": "b" * 64}
    return plan


def _inputs(tmp_path: Path, **overrides: str | None) -> Inputs:
    env = tmp_path / ".env"
    env.write_text(valid_env(**overrides))
    env.chmod(0o600)
    return parse_inputs(env.read_text(), env)


def test_the_fleet_names_both_key_files_and_holds_neither_key(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, NARWHAL_ROUTER_API_KEY=ROUTER_KEY)
    draft = fleet_draft(inputs, [_plan(inputs, 0), _plan(inputs, 1)])
    doc = parse_fleet(draft, "draft")  # what every role reads accepts it
    assert [t.key_file for t in doc.tenants] == ["../secrets/NARWHAL_ROUTER_API_KEY"]
    assert doc.engine_auth is not None
    assert doc.engine_auth.key_file == "../secrets/NARWHAL_ENGINE_KEY"
    text = json.dumps(draft)
    assert ROUTER_KEY not in text and "sk-engine" not in text


def test_without_keys_the_fleet_authenticates_nobody_as_before(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, NARWHAL_ENGINE_KEY=None)
    doc = parse_fleet(fleet_draft(inputs, [_plan(inputs)]), "draft")
    assert doc.tenants == () and doc.engine_auth is None


def test_the_launch_record_names_vllms_api_key_variable_never_its_value(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    record = launch_record(inputs, _plan(inputs))
    assert ENGINE_API_KEY_ENV in record["secret_environment"]
    assert "sk-engine" not in json.dumps(record)
    assert not any("api-key" in a or "api_key" in a for a in record["vllm_args"])
    (tmp_path / "bare").mkdir()
    bare = _inputs(tmp_path / "bare", NARWHAL_ENGINE_KEY=None)
    assert ENGINE_API_KEY_ENV not in launch_record(bare, _plan(bare))["secret_environment"]


def test_each_engine_host_gets_one_file_per_secret_variable_its_plan_names(
        tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, NARWHAL_ROUTER_API_KEY=ROUTER_KEY,
                     NARWHAL_NODE_2_ENGINE_ENV="'" + json.dumps(
                         {"HF_TOKEN": HF, "OMP_NUM_THREADS": "2"}) + "'")
    files = role_files(inputs, ["router", "engine-1", "engine-2"])
    for role in ("engine-1", "engine-2"):
        record = launch_record(inputs, _plan(inputs, int(role[-1]) - 1))
        env_files = {k.removeprefix("env/") for k in files[role].secrets if k.startswith("env/")}
        assert env_files == set(record["secret_environment"]), role
        assert files[role].secrets[f"env/{ENGINE_API_KEY_ENV}"] == "sk-engine-ffffffff"
        assert "sk-engine" not in files[role].env_text and HF not in files[role].env_text
    assert files["engine-2"].secrets["env/HF_TOKEN"] == HF
    assert "env/HF_TOKEN" not in files["engine-1"].secrets  # another engine's secret stays off
    assert files["router"].secrets["NARWHAL_ROUTER_API_KEY"] == ROUTER_KEY
    assert files["router"].secrets["NARWHAL_ENGINE_KEY"] == "sk-engine-ffffffff"
    assert "NARWHAL_ROUTER_API_KEY" not in files["engine-1"].secrets


@pytest.mark.parametrize("name", ["NARWHAL_ENGINE_KEY", "NARWHAL_ROUTER_API_KEY"])
@pytest.mark.parametrize("value", ["short-key", "'a key with spaces in it'", "k" * 15,
                                   "ключ-ключ-ключ-ключ"])
def test_a_bearer_key_the_hosts_would_refuse_is_refused_in_the_env_first(
        name: str, value: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_inputs(valid_env(**{name: value}), Path(".env"))
    problems = [p for p in caught.value.problems if p.field == name]
    assert problems and "openssl rand" in problems[0].fix
    assert value.strip("'") not in str(caught.value)
