"""An engine binds the address the fleet reaches it at, not every interface, where it can."""

from __future__ import annotations

import json
from pathlib import Path

from narwhal.core.launch_record import LaunchRecord
from narwhal.deploy.gates.discover_checks import EnginePlan
from narwhal.deploy.gates.generated import launch_record
from narwhal.deploy.inputs import parse_inputs
from narwhal.node.engine import runplan
from tests.envtext import valid_env


def _record(**overrides: str | None) -> LaunchRecord:
    inputs = parse_inputs(valid_env(**overrides), Path(".env"))
    plan = EnginePlan(inputs.engines[0], "node-1")
    plan.fabric_address, plan.accelerator = "10.0.0.5", "none"
    plan.image, plan.model = {"id": "sha256:" + "a" * 64}, {"model_tree_sha256": "b" * 64}
    return LaunchRecord.model_validate_json(json.dumps(launch_record(inputs, plan)))


def _host_args(record: LaunchRecord) -> list[str]:
    args = list(record.vllm_args)
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--host"]


def test_the_engine_binds_its_fabric_address_and_its_host_reaches_it_there() -> None:
    record = _record()
    assert _host_args(record) == ["10.0.0.5"]
    plan = runplan.build(record, "c" * 64, "native")
    assert plan["url"] == "http://10.0.0.5:8000"  # capture, idle proof and sidecar use it


def test_a_url_by_name_or_an_operators_own_host_keeps_their_choice() -> None:
    named = _record(NARWHAL_NODE_1_URL="http://engine-1.fleet:8000")
    assert _host_args(named) == []
    assert runplan.build(named, "c" * 64, "native")["url"] == "http://127.0.0.1:8000"
    own = _record(NARWHAL_ENGINE_ARGS="'[\"--host\",\"0.0.0.0\"]'")
    assert _host_args(own) == ["0.0.0.0"]  # once, the operator's
    assert runplan.build(own, "c" * 64, "native")["url"] == "http://127.0.0.1:8000"
