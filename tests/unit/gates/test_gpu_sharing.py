"""Do two engines share a GPU: one rule over GPUs as discovery resolved them (the machine it
measured, the driver's UUID), whatever the .env wrote and however each host was logged in to;
the .env check, which has no facts, never finds a sharing that discovery would not."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.core.gpu_sharing import Allocation, share_groups, sharings
from narwhal.core.launch_record import LaunchRecord
from narwhal.deploy.gates.discover_checks import all_problems
from narwhal.deploy.gates.engines import EngineTarget, start_groups, with_machines
from narwhal.deploy.inputs import parse_inputs
from tests.envtext import valid_env
from tests.unit.gates.test_discover_checks import BASE, _facts

MACHINE = "5e" * 32  # the machine_id_hmac both sessions measured
UUIDS = [f"GPU-5eed{k:04x}-aaaa-4bbb-8ccc-{k:012x}" for k in range(2)]
PORTS_2 = {"NARWHAL_NODE_2_ENGINE_PORT": "8001", "NARWHAL_NODE_2_ATTEST_PORT": "8011",
           "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5601"}
ANOTHER_LOGIN, ANOTHER_ADDRESS = "ops@10.213.0.11", "root@10.213.0.12"  # node 1: root@10.213.0.11
SHARED = "NARWHAL_NODE_2_GPU_IDS: GPU 0 ({}) is also allocated to engine-1"


def _env(node_2_ssh: str, gpu_1: str, gpu_2: str, **more: str | None) -> str:
    return valid_env(**{**BASE, "NARWHAL_NODE_2_SSH": node_2_ssh,
                        "NARWHAL_NODE_2_SSH_PASSWORD": None, "NARWHAL_NODE_2_IP": "10.20.0.11",
                        "NARWHAL_NODE_1_GPU_IDS": gpu_1, "NARWHAL_NODE_2_GPU_IDS": gpu_2,
                        **PORTS_2, **more})


def _one_machine(machine_id_hmac: str | None = MACHINE) -> dict[str, dict[str, Any]]:
    """One machine seen through two sessions: node-1 and node-2 measured the same facts."""
    facts = _facts(1, "10.20.0.11")
    for k, gpu in enumerate(facts["accelerators"]["gpus"]):
        gpu["uuid"] = UUIDS[k]
    facts["machine_id_hmac"] = machine_id_hmac
    return {"node-1": facts, "node-2": copy.deepcopy(facts)}


def _discover(text: str, facts: dict[str, dict[str, Any]] | None = None,
              allowance: bool | None = None) -> list[str]:
    inputs = parse_inputs(text, Path(".env"))
    if allowance is not None:
        inputs = inputs.model_copy(update={"shared_gpu_allowance": allowance})
    problems, _ = all_problems(inputs, facts or _one_machine(),
                               {"engine-1": "node-1", "engine-2": "node-2"})
    return [p.line() for p in problems]


@pytest.mark.parametrize("node_2_ssh", [ANOTHER_LOGIN, ANOTHER_ADDRESS])
@pytest.mark.parametrize(("gpu_1", "gpu_2"), [
    ("0", UUIDS[0]),  # an index here, its UUID there
    ("00", UUIDS[0].replace("aaaa", "AAAA")),  # a padded index, the UUID in upper case
])
def test_one_gpu_spelt_two_ways_through_two_logins_of_one_machine_is_shared(
        node_2_ssh: str, gpu_1: str, gpu_2: str) -> None:
    """Before: GPUs were compared per SSH session and by the .env's spelling, so this passed
    and Gate C started both engines at once on one GPU."""
    lines = _discover(_env(node_2_ssh, gpu_1, gpu_2))
    assert [ln for ln in lines if "also allocated" in ln] == [
        f"node-2: {SHARED.format(UUIDS[0])} on node-1 (the same machine); give colocated "
        "engines disjoint GPUs, or set NARWHAL_SHARED_GPU_ALLOWANCE=true to let them share "
        "(they start one after another)"], lines
    assert _discover(_env(node_2_ssh, gpu_1, gpu_2), allowance=True) == []


@pytest.mark.parametrize("node_2_ssh", [ANOTHER_LOGIN, ANOTHER_ADDRESS])
@pytest.mark.parametrize(("gpu_1", "gpu_2"), [("0", UUIDS[1]), ("00", "1"), (UUIDS[0], "01")])
def test_different_gpus_of_one_machine_however_spelt_are_not_shared(
        node_2_ssh: str, gpu_1: str, gpu_2: str) -> None:
    assert _discover(_env(node_2_ssh, gpu_1, gpu_2)) == []


def test_two_logins_to_one_machine_are_one_machine_and_two_hosts_are_two() -> None:
    """The machine is what discovery measured; only a host without a machine id falls back
    to its SSH machine (address and port), where two users of one address are still one."""
    def machines(node_2_ssh: str, facts: dict[str, dict[str, Any]]) -> set[str]:
        inputs = parse_inputs(_env(node_2_ssh, "0", "1"), Path(".env"))
        _, plans = all_problems(inputs, facts, {"engine-1": "node-1", "engine-2": "node-2"})
        return {p.machine for p in plans}

    assert len(machines(ANOTHER_ADDRESS, _one_machine())) == 1
    assert len(machines(ANOTHER_LOGIN, _one_machine(None))) == 1
    assert len(machines(ANOTHER_ADDRESS, _one_machine(None))) == 2
    two = _one_machine()
    two["node-2"]["machine_id_hmac"] = "77" * 32
    assert len(machines(ANOTHER_LOGIN, two)) == 2


def test_one_engine_naming_one_gpu_twice_is_refused_before_and_after_discovery() -> None:
    with pytest.raises(InputError, match="NARWHAL_NODE_1_GPU_IDS: names a GPU twice"):
        parse_inputs(_env(ANOTHER_ADDRESS, "0,00", "1"), Path(".env"))
    lines = _discover(_env(ANOTHER_ADDRESS, f"0,{UUIDS[0]}", "1"))
    assert any(f"NARWHAL_NODE_1_GPU_IDS: {UUIDS[0]} names GPU 0 a second time" in ln
               for ln in lines), lines


@pytest.mark.parametrize(("gpu_1", "gpu_2", "more"), [
    ("0", "0", {}),
    ("0", "00", {}),  # before: two spellings, so the .env check saw two GPUs
    (UUIDS[0], UUIDS[0].upper(), {}),  # nvidia-smi prints lower case
    ("0", "0", {"NARWHAL_GPU_MEMORY_UTILIZATION": "0.4"}),  # before: let through here, then
])                                                          # refused by discovery
def test_what_the_env_check_finds_discovery_finds_and_the_allowance_settles_both(
        gpu_1: str, gpu_2: str, more: dict[str, str]) -> None:
    """Same login, the same GPU written the same way: the .env check refuses it without the
    allowance, as discovery does; with it, both let it through (before: the .env check
    ignored NARWHAL_SHARED_GPU_ALLOWANCE and refused what discovery allows)."""
    with pytest.raises(InputError) as caught:
        parse_inputs(_env("root@10.213.0.11", gpu_1, gpu_2, **more), Path(".env"))
    assert "NARWHAL_NODE_2_GPU_IDS: GPU" in str(caught.value)
    assert "is also allocated to engine-1" in str(caught.value)
    assert "NARWHAL_SHARED_GPU_ALLOWANCE=true" in str(caught.value)
    allowed = _env("root@10.213.0.11", gpu_1, gpu_2, NARWHAL_SHARED_GPU_ALLOWANCE="true", **more)
    assert _discover(allowed) == []
    assert any(SHARED.format(UUIDS[0]) in ln for ln in _discover(allowed, allowance=False))


def test_the_rule_links_engines_by_gpu_on_one_machine_only() -> None:
    fleet = [Allocation("engine-1", "m1", ("GPU-a",)), Allocation("engine-2", "m2", ("GPU-a",)),
             Allocation("engine-3", "m1", ("GPU-b", "GPU-a")),
             Allocation("engine-4", "m1", ("GPU-b",)), Allocation("engine-5", "m1", ("GPU-c",))]
    assert [(s.engine, s.holder, s.gpu) for s in sharings(fleet)] == [
        ("engine-3", "engine-1", "GPU-a"), ("engine-4", "engine-3", "GPU-b")]
    assert share_groups(fleet) == [["engine-1", "engine-3", "engine-4"], ["engine-2"],
                                   ["engine-5"]]


def _target(role: str, alias: str, uuid: str) -> EngineTarget:
    record = LaunchRecord.model_validate_json(json.dumps({
        "schema": "narwhal.launch-record", "schema_version": 1, "engine": role, "host": alias,
        "runtime": "docker", "image": {"ref": "x", "id": "sha256:" + "a" * 64},
        "devices": [{"index": 0, "uuid": uuid, "pci_bus_id": "0000:01:00.0"}],
        "accelerator": "nvidia", "tensor_parallel_size": 1, "model_dir": "/m",
        "model_tree_sha256": "b" * 64, "served_model_name": "m", "run_dir": "/srv",
        "fabric_interface": "fab0", "fabric_address": "10.0.0.2",
        "ports": {"engine": 8000, "attest": 8100, "nixl_side_channel": 5600,
                  "ucx_tcp": [30000, 30100]},
        "kv_transfer_config": {}, "environment": {}, "vllm_args": []}))
    return EngineTarget(role, alias, record, "f" * 64)


def test_engines_on_one_machine_through_two_logins_start_one_after_another() -> None:
    """Gate C groups by the machine Gate A measured (discovery.json), not by SSH session."""
    targets = [_target("engine-1", "node-1", UUIDS[0]), _target("engine-2", "node-2", UUIDS[0]),
               _target("engine-3", "node-3", UUIDS[0])]
    discovery = {"engines": [{"engine": "engine-1", "machine": "machine-id:" + MACHINE},
                             {"engine": "engine-2", "machine": "machine-id:" + MACHINE},
                             {"engine": "engine-3", "machine": "machine-id:" + "77" * 32}]}
    groups = start_groups(with_machines(targets, discovery))
    assert [[t.role for t in g] for g in groups] == [["engine-1", "engine-2"], ["engine-3"]]
    # a record from before the machine was measured: each session is its own machine
    assert len(start_groups(with_machines(targets, {"engines": []}))) == 3
