"""Tool doubles on lab hosts answer in the real tools' formats with each host's own inventory."""

from __future__ import annotations

import json

import pytest

from narwhal.lab import identity
from narwhal.lab.faults import Faults
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

QUERY = "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total --format=csv,noheader"


@pytest.mark.lab
@pytest.mark.parametrize("host", ["eng1", "eng2"])
def test_nvidia_smi_and_image_inspect_report_the_hosts_own_inventory(needs_lab: LabPlan, host: str) -> None:
    h = needs_lab.host(host)
    assert h.host.hardware is not None
    acc = h.host.hardware.accelerators
    image = identity.image_id(needs_lab.spec.image)
    out = ssh(needs_lab, host, f"{QUERY}; docker image inspect --format '{{{{.Id}}}}' {image}; "
                               f"docker image inspect {image}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == [f"{i}, {acc.product}, {d.uuid}, {d.pci_bus_id}, {acc.memory_mib} MiB"
                         for i, d in enumerate(acc.devices)]
    assert lines[2] == image
    inspected = json.loads("\n".join(lines[3:]))
    assert inspected[0]["Id"] == image
    assert inspected[0]["RepoDigests"] == [identity.repo_digest(needs_lab.spec.image)]


@pytest.mark.lab
def test_device_nodes_and_pci_view_exist_only_inside_the_host(needs_lab: LabPlan) -> None:
    out = ssh(needs_lab, "eng1", "ls /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl && "
                                 "cat /sys/bus/pci/devices/*/vendor | sort -u && lspci -D")
    assert out.returncode == 0, out.stderr
    assert "0x10de" in out.stdout and "3D controller: NVIDIA" in out.stdout
    router = ssh(needs_lab, "router", "command -v nvidia-smi; ls /dev/nvidia0")
    assert router.returncode != 0 and router.stdout == ""


@pytest.mark.lab
def test_docker_runs_a_container_as_a_host_process(needs_lab: LabPlan) -> None:
    image = identity.image_id(needs_lab.spec.image)
    # named, so that what the shared lab's other tests left on eng2 is not counted
    out = ssh(needs_lab, "eng2",
              f"docker run --rm --name rm-probe --entrypoint sh {image} -c 'echo $UCX_TLS; exit 3'; "
              "echo rc=$?; docker inspect nosuch; echo rc=$?; docker ps -aq --filter name=rm-probe | wc -l")
    assert out.stdout.split() == ["tcp", "rc=3", "[]", "rc=1", "0"], out.stderr
    assert "Error: No such object: nosuch" in out.stderr


@pytest.mark.lab
def test_a_failing_tool_double_fails_as_stated_until_cleared(faults: Faults) -> None:
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    faults.tool("eng1", "nvidia-smi", 9, msg + "\n")
    out = ssh(faults.plan, "eng1", "nvidia-smi -L")
    assert (out.returncode, out.stderr.strip()) == (9, msg)
    faults.clear()
    assert ssh(faults.plan, "eng1", "nvidia-smi -L").returncode == 0
