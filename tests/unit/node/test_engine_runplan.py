"""The run plan gives each runtime exactly the launch record's GPUs, the way that runtime and
that vendor's container toolkit take them, and a launch record whose devices do not match its
accelerator is refused before any plan exists."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from narwhal.core.launch_record import LaunchRecord
from narwhal.node.engine import runplan

UUIDS = ("GPU-0c4a7f2e1b9d3a58", "GPU-1d5b8a3f2c0e4b69")


def _record(runtime: str, accelerator: str, **changes: Any) -> LaunchRecord:
    devices = [] if accelerator == "none" else [
        {"index": i, "uuid": u, "pci_bus_id": f"0000:{0x11 + i:02x}:00.0",
         **({"render_node": f"/dev/dri/renderD{128 + i}"} if accelerator == "amd" else {})}
        for i, u in enumerate(UUIDS)]
    doc: dict[str, Any] = {
        "schema": "narwhal.launch-record", "schema_version": 1, "engine": "engine-1",
        "host": "node-1", "runtime": runtime, "image": {"ref": "vllm/vllm:x", "id": "sha256:" + "a" * 64},
        "accelerator": accelerator, "devices": devices, "tensor_parallel_size": 2,
        "model_dir": "/models/m", "model_tree_sha256": "b" * 64, "served_model_name": "m",
        "run_dir": "/srv/run", "fabric_interface": "fab0", "fabric_address": "10.0.0.1",
        "ports": {"engine": 8000, "attest": 8100, "nixl_side_channel": 5600,
                  "ucx_tcp": [30000, 30100]},
        "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        "environment": {}, "vllm_args": ["--tensor-parallel-size", "2"]}
    doc.update(changes)
    return LaunchRecord.model_validate_json(json.dumps(doc))  # as a file is read


def _argv(record: LaunchRecord, runtime: str | None = None) -> list[str]:
    plan = runplan.build(record, "c" * 64, runtime or record.runtime)
    argv: list[str] = plan["argv"]
    return argv


def _flags(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_docker_with_nvidia_gets_the_gpus_by_uuid_through_the_toolkit() -> None:
    argv = _argv(_record("docker", "nvidia"))
    assert _flags(argv, "--gpus") == ["device=" + ",".join(UUIDS)]
    assert "/dev/kfd" not in argv


def test_podman_with_nvidia_gets_one_cdi_device_per_gpu() -> None:
    argv = _argv(_record("podman", "nvidia"))
    assert argv[0] == "podman" and "--gpus" not in argv
    assert _flags(argv, "--device") == [f"nvidia.com/gpu={u}" for u in UUIDS]


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_rocm_gets_kfd_and_exactly_its_render_nodes_and_the_video_group(runtime: str) -> None:
    argv = _argv(_record(runtime, "amd"))
    assert _flags(argv, "--device") == ["/dev/kfd", "/dev/dri/renderD128", "/dev/dri/renderD129"]
    assert _flags(argv, "--group-add") == ["video"] and "--gpus" not in argv


def test_a_native_gpu_engine_is_told_which_gpus_are_its_own() -> None:
    nvidia = runplan.build(_record("docker", "nvidia"), "c" * 64, "native")
    assert nvidia["environment"]["CUDA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    amd = runplan.build(_record("docker", "amd"), "c" * 64, "native")
    assert amd["environment"]["ROCR_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert "CUDA_VISIBLE_DEVICES" not in amd["environment"]


def test_a_cpu_engine_has_no_device_flags() -> None:
    argv = _argv(_record("docker", "none"))
    assert "--gpus" not in argv and "--device" not in argv


@pytest.mark.parametrize(("accelerator", "devices", "said"), [
    ("none", [{"index": 0, "uuid": "GPU-1", "pci_bus_id": "0000:11:00.0"}], "a CPU engine"),
    ("nvidia", [], "a GPU engine at least one"),
    ("amd", [{"index": 0, "uuid": "GPU-1", "pci_bus_id": "0000:11:00.0"}], "render_node"),
    ("amd", [{"index": 0, "uuid": "GPU-1", "pci_bus_id": "0000:11:00.0",
              "render_node": "/dev/dri/../../etc/passwd"}], "pattern"),
])
def test_devices_that_do_not_match_the_accelerator_are_refused(
        accelerator: str, devices: list[dict[str, Any]], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        _record("docker", accelerator, devices=devices)
