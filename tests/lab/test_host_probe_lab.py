"""Discovery's probe, copied to each lab host over SSH and run there with python3, reports that
host's own inventory: GPUs, image, fabric interface and checkpoint, as the lab spec declares.

The GPU UUIDs and bus ids differ per host, so a probe that read anything but the host it runs
on (or a stub) could not pass.
"""

from __future__ import annotations

import base64
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from narwhal.core import result_line
from narwhal.core.host_facts import HostFacts, parse_host_facts
from narwhal.lab import identity
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh
from narwhal.node import host_probe

pytestmark = pytest.mark.lab

CODE = Path(host_probe.__file__).read_bytes()
REMOTE_DIR = "/tmp/narwhal-probe-lab"  # the host's own private /tmp
REMOTE = f"{REMOTE_DIR}/host_probe.py"


def _request(plan: LabPlan, role: str) -> dict[str, Any]:
    spec = plan.spec
    engine = role == "engine"
    return {"schema": "narwhal.host-probe-request", "schema_version": 1, "role": role,
            "run_dir": spec.run_dir, "model_dir": spec.model.dir if engine else None,
            "fabric_interface": "fab0", "ports": [22, spec.ports.engine],
            "image": identity.image_id(spec.image) if engine else None,
            "runtime": "docker" if engine else None, "hash_model": engine}


def _probe(plan: LabPlan, host: str) -> HostFacts:
    """Copy the probe file to the host (sha256-checked there), run it, validate its line."""
    role = plan.host(host).host.role
    request = base64.b64encode(json.dumps(_request(plan, role)).encode()).decode()
    command = (f"mkdir -p {REMOTE_DIR} && echo {base64.b64encode(CODE).decode()} | base64 -d > {REMOTE}"
               f" && sha256sum {REMOTE} && echo {request} | base64 -d | python3 {REMOTE};"
               f" rc=$?; rm -rf {REMOTE_DIR}; exit $rc")
    done = ssh(plan, host, command, timeout=60)
    assert done.returncode == 0, f"{host}: {done.stdout}{done.stderr}"
    assert done.stdout.split()[0] == hashlib.sha256(CODE).hexdigest(), "the copy differs"
    result = result_line.parse(done.stdout, "narwhal-host-probe")
    assert result.ok, result.error
    return parse_host_facts(result.data, host)


@pytest.fixture(scope="module")
def probed(lab: LabPlan) -> dict[str, HostFacts]:
    """Every lab host probed once, concurrently, as discovery inspects them."""
    names = [h.name for h in lab.hosts]
    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(lambda n: _probe(lab, n), names), strict=True))


@pytest.mark.parametrize("host", ["eng1", "eng2", "eng3"])
def test_each_engine_host_reports_its_own_gpus_by_uuid_and_bus_id(
        lab: LabPlan, probed: dict[str, HostFacts], host: str) -> None:
    hardware = lab.host(host).host.hardware
    assert hardware is not None
    acc = probed[host].accelerators
    assert (acc.vendor, acc.error, acc.driver_version) == ("nvidia", None, "580.159.04")
    assert [(g.index, g.uuid, g.pci_bus_id, g.name, g.memory_total_mib, g.numa_node) for g in acc.gpus] == [
        (i, d.uuid, identity.sysfs_bus_id(d.pci_bus_id), hardware.accelerators.product,
         hardware.accelerators.memory_mib, 0)
        for i, d in enumerate(hardware.accelerators.devices)]
    assert {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"} <= set(probed[host].device_nodes)
    assert probed[host].hostname == lab.host(host).netns


@pytest.mark.parametrize("host", ["eng1", "eng2", "eng3"])
def test_each_engine_host_reports_the_image_fabric_listener_and_run_dir(
        lab: LabPlan, probed: dict[str, HostFacts], host: str) -> None:
    h, facts = lab.host(host), probed[host]
    assert facts.image is not None and facts.image.found and facts.image.error is None
    assert facts.image.id == identity.image_id(lab.spec.image)
    assert facts.image.repo_digests == [identity.repo_digest(lab.spec.image)]
    fab = facts.fabric_interface
    assert fab is not None and (fab.name, fab.mtu, fab.operstate) == ("fab0", 9000, "UP")
    assert [(a.address, a.prefixlen, a.scope) for a in fab.addresses if a.family == "inet"] == [
        (h.fabric_ip, lab.fabric_prefix, "global")]
    assert [(x.port, x.address, x.process) for x in facts.listeners] == [(22, h.mgmt_ip, "sshd")]
    run_dir = facts.disk[lab.spec.run_dir]
    assert run_dir.exists and run_dir.writable and run_dir.free_bytes is not None
    assert facts.python.has_venv and facts.tools["ss"].path and facts.tools["ip"].path


def test_the_three_engine_hosts_hold_one_checkpoint(probed: dict[str, HostFacts]) -> None:
    models = [probed[h].model for h in ("eng1", "eng2", "eng3")]
    assert all(m is not None and m.error is None for m in models)
    digests = {m.model_tree_sha256 for m in models if m is not None}
    assert len(digests) == 1 and None not in digests
    assert [r[0] for r in models[0].rows] == [  # type: ignore[union-attr]
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    assert models[0].architectures == ["LlamaForCausalLM"]  # type: ignore[union-attr]


def test_the_router_host_has_no_gpu_tool_no_gpu_and_no_device_nodes(probed: dict[str, HostFacts]) -> None:
    router = probed["router"]
    assert router.role == "router" and router.tools["nvidia-smi"].path is None
    assert router.accelerators.model_dump() == {"vendor": None, "gpus": [], "driver_version": None,
                                                "error": None}
    assert router.device_nodes == [] and router.model is None and router.image is None
