"""With NARWHAL_KV_EVENTS_PORT the launch asks vLLM for KV events on that port and records it,
the run plan and Gate C's checks know the port, the fleet tells the router where to subscribe,
and the router gets the checkpoint's own tokenizer; without it nothing changes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import TransferMismatch
from narwhal.core.fleet import parse_fleet
from narwhal.core.kv.events import parse_events_config
from narwhal.core.kv.vllm_args import launch_plan_from_args
from narwhal.core.launch_record import LaunchRecord
from narwhal.deploy.gates import tokenizer
from narwhal.deploy.gates.discover import plan as discover_plan
from narwhal.deploy.gates.discover_checks import EnginePlan
from narwhal.deploy.gates.generated import fleet_draft, launch_record
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.inputs import parse_inputs
from narwhal.deploy.inputs.model import Inputs
from narwhal.node.engine import runplan
from tests.envtext import valid_env


def _plans(inputs: Inputs) -> list[EnginePlan]:
    plans = []
    for n, e in enumerate(inputs.engines, 1):
        plan = EnginePlan(e, f"node-{n}")
        plan.fabric_address, plan.accelerator = f"10.0.0.{n}", "none"
        plan.image, plan.model = {"id": "sha256:" + "a" * 64}, {"model_tree_sha256": "b" * 64}
        plans.append(plan)
    return plans


def _launch(**overrides: str | None) -> tuple[Inputs, list[EnginePlan], LaunchRecord]:
    inputs = parse_inputs(valid_env(**overrides), Path(".env"))
    plans = _plans(inputs)
    record = LaunchRecord.model_validate_json(json.dumps(launch_record(inputs, plans[0])))
    return inputs, plans, record


def _flag(args: tuple[str, ...] | list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_the_launch_publishes_events_on_the_port_every_interface_and_records_it() -> None:
    _, _, record = _launch(NARWHAL_KV_EVENTS_PORT="5557")
    (text,) = _flag(record.vllm_args, "--kv-events-config")
    config = parse_events_config(text)  # what vLLM (and the emulator) will read
    assert config.publishes and config.endpoint == "tcp://*:5557" and config.topic == ""
    assert json.loads(text)["publisher"] == "zmq"
    assert record.ports.kv_events == 5557
    assert "--no-enable-prefix-caching" not in record.vllm_args  # vLLM's default: on
    # answers say how many prompt tokens the engine found cached: the router's observed hits
    assert "--enable-prompt-tokens-details" in record.vllm_args


def test_without_the_port_the_record_is_as_before() -> None:
    inputs, plans, record = _launch()
    assert "--kv-events-config" not in record.vllm_args
    assert "--enable-prompt-tokens-details" not in record.vllm_args
    assert record.ports.kv_events is None
    assert "kv_events" not in launch_record(inputs, plans[0])["ports"]  # digest unchanged
    assert "kv_events" not in runplan.build(record, "c" * 64, "native")["ports"]


def test_the_run_plan_carries_the_flag_and_the_port_gate_c_checks() -> None:
    _, _, record = _launch(NARWHAL_KV_EVENTS_PORT="5557")
    plan = runplan.build(record, "c" * 64, "docker")
    assert plan["ports"]["kv_events"] == 5557
    assert len(_flag(plan["argv"], "--kv-events-config")) == 1
    native = runplan.build(record, "c" * 64, "native")["argv"]
    assert json.loads(_flag(native, "--kv-events-config")[0])["endpoint"] == "tcp://*:5557"


def test_the_capture_still_reads_the_launch_as_a_kv_plan() -> None:
    _, _, record = _launch(NARWHAL_KV_EVENTS_PORT="5557")
    plan = launch_plan_from_args([record.model_dir, *record.vllm_args], name="engine-1",
                                 vllm_version="0.32.0")
    assert plan.block_size == 128  # the events JSON was taken as a flag's value, not a model


def test_gate_a_probes_the_events_port_for_listeners() -> None:
    inputs = parse_inputs(valid_env(NARWHAL_KV_EVENTS_PORT="5557"), Path(".env"))
    ports = [t.request["ports"] for t in discover_plan(inputs) if t.role == "engine"]
    assert ports and all(5557 in p for p in ports)


def test_the_fleet_names_each_engine_s_endpoint_at_the_address_the_router_reaches() -> None:
    inputs, plans, _ = _launch(NARWHAL_KV_EVENTS_PORT="5557",
                               NARWHAL_NODE_2_URL="http://engine-2.fleet:8000")
    fleet = fleet_draft(inputs, plans)
    parse_fleet(json.loads(json.dumps(fleet)), "fleet-draft.json")  # as the router reads it
    assert [e["kv_events"] for e in fleet["engines"]] == [
        {"endpoint": "tcp://10.0.0.1:5557", "topic": ""},
        {"endpoint": "tcp://engine-2.fleet:5557", "topic": ""}]
    assert "prefix_cache" not in fleet  # Gate F adds it where it places the tokenizer


def test_a_fleet_without_events_is_the_fleet_of_today() -> None:
    inputs, plans, _ = _launch()
    fleet = fleet_draft(inputs, plans)
    assert all(set(e) == {"id", "url", "role"} for e in fleet["engines"])
    assert "prefix_cache" not in fleet


def test_only_the_engines_that_publish_are_followed() -> None:
    inputs, plans, _ = _launch(NARWHAL_NODE_2_KV_EVENTS_PORT="5557")
    assert ["kv_events" in e for e in fleet_draft(inputs, plans)["engines"]] == [False, True]
    assert tokenizer.source(plans) is plans[1]


def _facts(files: dict[str, bytes]) -> dict[str, Any]:
    rows = [[name, len(data), hashlib.sha256(data).hexdigest()] for name, data in files.items()]
    return {"model": {"rows": [*rows, ["sub/tokenizer.json", 1, "0" * 64],
                               ["model.safetensors", 9, "1" * 64]]}}


def test_the_router_gets_the_checkpoint_s_tokenizer_files_as_gate_a_hashed_them(
        tmp_path: Path) -> None:
    files = {"tokenizer.json": b'{"model": {}}', "tokenizer_config.json": b"{}",
             "special_tokens_map.json": b"{}"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    wanted = tokenizer.wanted(_facts(files))
    assert sorted(wanted) == sorted(files)  # top-level tokenizer files only
    assert tokenizer.fetch(LocalHost(), str(tmp_path), wanted) == files


def test_a_tokenizer_file_changed_since_gate_a_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(b"changed")
    wanted = {"tokenizer.json": hashlib.sha256(b"original").hexdigest()}
    with pytest.raises(TransferMismatch, match="Gate A measured"):
        tokenizer.fetch(LocalHost(), str(tmp_path), wanted)


def test_a_checkpoint_without_tokenizer_json_blocks_events_naming_the_field() -> None:
    _, plans, _ = _launch(NARWHAL_KV_EVENTS_PORT="5557")
    wanted = tokenizer.wanted(_facts({"tokenizer.model": b"sp"}))
    (problem,) = tokenizer.missing(plans[0], wanted)
    assert problem.field == "node-1: NARWHAL_KV_EVENTS_PORT"
    assert "tokenizer.json" in problem.problem
