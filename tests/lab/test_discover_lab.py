"""Gate A on the lab, driven from the workstation namespace as an operator runs it.

`narwhal discover` reaches the hosts only over SSH (pinned keys, one master per host); the
facts it records must be the ones each lab host was built with (GPU UUIDs and bus ids differ
per host, so nothing can fake them), and each bad case must block naming the host and a fix,
with nothing generated.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.lab.operator import NARWHAL, Operator

from narwhal.lab import envfile, identity
from narwhal.lab.faults import Faults
from narwhal.lab.plan import LabPlan

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def operator(lab: LabPlan, tmp_path_factory: pytest.TempPathFactory) -> Operator:
    work = tmp_path_factory.mktemp("discover")
    env = work / ".env"
    envfile.write(lab, env)
    with env.open("a") as fh:
        fh.write(f"NARWHAL_DEPLOYMENT=lab\nNARWHAL_DEPLOYMENT_REVISION={REVISION}\n")
    op = Operator(lab, env, work / "runs")
    done = op.narwhal("hosts", "trust", "--yes")
    assert done.returncode == 0, done.stderr
    return op


def _facts(attempt: Path, alias: str) -> dict[str, Any]:
    return dict(json.loads((attempt / f"host-facts-{alias}.json").read_text()))


def test_discovery_of_the_default_lab_passes_with_each_hosts_own_facts(
        operator: Operator) -> None:
    code, doc = operator.discover()
    assert code == 0 and doc["verdict"] == "passed", doc
    attempt = operator.last_attempt()
    trees = set()
    for n, h in enumerate(operator.plan.engines(), start=1):
        facts = _facts(attempt, f"node-{n}")
        gpus = facts["accelerators"]["gpus"]
        assert h.host.hardware is not None
        declared = h.host.hardware.accelerators.devices
        assert [g["uuid"] for g in gpus] == [d.uuid for d in declared]
        assert [g["pci_bus_id"] for g in gpus] == [_bdf(d.pci_bus_id) for d in declared]
        assert facts["image"]["id"] == identity.image_id(operator.plan.spec.image)
        trees.add(facts["model"]["model_tree_sha256"])
    assert len(trees) == 1 and None not in trees
    assert (attempt / "fleet-draft.json").exists()
    assert sorted(p.name for p in attempt.glob("launch-engine-*.json")) == [
        f"launch-engine-{n}.json" for n in range(1, len(operator.plan.engines()) + 1)]
    _probes_overlap(attempt)
    status = operator.narwhal("status", "--json")
    gates = {g["gate"]: g for g in json.loads(status.stdout)["gates"]}
    assert gates["discover"]["state"] == "passed"
    moved = operator.variant("moved-image", NARWHAL_ENGINE_IMAGE="sha256:" + "0" * 64)
    gates = {g["gate"]: g for g in json.loads(
        operator.narwhal("status", "--json", env=moved).stdout)["gates"]}
    assert gates["discover"]["state"] == "stale"
    assert "engine-image" in gates["discover"]["reason"]


def _bdf(bus_id: str) -> str:
    """nvidia-smi's 8-digit PCI domain as sysfs writes it (4 digits, lower case)."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _probes_overlap(attempt: Path) -> None:
    rows = [json.loads(line) for line in (attempt / "commands.jsonl").read_text().splitlines()]
    spans = [(datetime.fromisoformat(r["start"].replace("Z", "+00:00")),
              datetime.fromisoformat(r["end"].replace("Z", "+00:00")), r["host"])
             for r in rows if r["argv"][:1] == ["python3"] and r["host"].startswith("node-")]
    assert len(spans) >= 3
    first_end = min(end for _, end, _ in spans)
    assert all(start < first_end for start, _, _ in spans), spans  # all were running at once


def _blocked(operator: Operator, expected: str, env: Path | None = None) -> list[str]:
    code, doc = operator.discover(env)
    assert code != 0 and doc["verdict"] == "blocked", doc
    lines = [f"{p['field']}: {p['problem']}; {p['fix']}" for p in doc["problems"]]
    assert any(expected in line for line in lines), lines
    attempt = operator.last_attempt()
    assert not (attempt / "fleet-draft.json").exists()
    assert not list(attempt.glob("launch-*.json"))
    return lines


@contextmanager
def _edited(path: Path, data: bytes) -> Iterator[None]:
    old = path.read_bytes()
    path.write_bytes(data)
    try:
        yield
    finally:
        path.write_bytes(old)


def test_one_changed_byte_in_one_hosts_tokenizer_config_blocks_naming_it(
        operator: Operator) -> None:
    eng2 = operator.plan.engines()[1]
    path = eng2.dir / operator.plan.spec.model.dir.lstrip("/") / "tokenizer_config.json"
    data = path.read_bytes()
    with _edited(path, data[:-2] + bytes([data[-2] ^ 1]) + data[-1:]):
        _blocked(operator, "node-2: NARWHAL_NODE_2_MODEL_DIR: checkpoint differs from node-1's: "
                 "first differing file tokenizer_config.json")


def test_nvidia_smi_failing_without_a_driver_blocks_with_its_message(
        operator: Operator, faults: Faults) -> None:
    faults.tool("eng1", "nvidia-smi", 9, "NVIDIA-SMI has failed because it couldn't "
                "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver "
                "is installed and running.")
    _blocked(operator, "node-1: accelerators: GPU inspection failed")


def test_gpu_ids_that_do_not_exist_block_naming_the_gpus_found(operator: Operator) -> None:
    env = operator.variant("bad-gpus", NARWHAL_NODE_2_GPU_IDS="0,7")
    _blocked(operator, "node-2: NARWHAL_NODE_2_GPU_IDS: GPU(s) 7 do not exist", env)


def test_a_missing_run_dir_and_fabric_interface_block(operator: Operator) -> None:
    env = operator.variant("bad-dirs", NARWHAL_NODE_1_RUN_DIR="/srv/nowhere",
                           NARWHAL_NODE_3_FABRIC_INTERFACE="fab9")
    lines = _blocked(operator, "node-1: NARWHAL_NODE_1_RUN_DIR: /srv/nowhere does not exist",
                     env)
    assert any("node-3: NARWHAL_NODE_3_FABRIC_INTERFACE: interface 'fab9'" in ln
               for ln in lines), lines


def test_a_re_keyed_host_blocks_with_both_fingerprints(operator: Operator,
                                                      faults: Faults) -> None:
    faults.rekey("eng3")
    lines = _blocked(operator, "node-3: ssh")
    assert any("SHA256:" in ln and ln.count("SHA256:") >= 2 for ln in lines), lines


def _env_value(operator: Operator, key: str) -> str:
    for line in operator.env.read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip("'\"")
    raise AssertionError(f"{key} not in the lab .env")


def test_tp_larger_than_the_gpus_and_an_ip_off_the_interface_block(operator: Operator) -> None:
    env = operator.variant("bad-tp-ip", NARWHAL_NODE_1_TENSOR_PARALLEL_SIZE="8",
                           NARWHAL_NODE_2_IP="10.99.0.200")
    lines = _blocked(operator, "node-1: NARWHAL_NODE_1_TENSOR_PARALLEL_SIZE: TP 8 is larger "
                     "than the 2 GPU(s)", env)
    assert any("node-2: NARWHAL_NODE_2_IP: 10.99.0.200 is not an address of" in ln
               for ln in lines), lines


def test_a_port_already_listening_blocks_naming_its_owner(operator: Operator) -> None:
    port = int(_env_value(operator, "NARWHAL_ENGINE_PORT"))
    # It holds the port until its stdin closes: nsenter forks into the host's namespaces, so
    # ending our child by PID would not end the listener; closing the pipe does.
    squatter = subprocess.Popen(
        [NARWHAL, "lab", "exec", "--host", "eng2", "--", "python3", "-c",
         "import socket, sys\n"
         "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('0.0.0.0', {port})); s.listen(); print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert squatter.stdin is not None and squatter.stdout is not None
    try:
        assert squatter.stdout.readline().strip() == "up"
        _blocked(operator, f"node-2: NARWHAL_NODE_2_ENGINE_PORT: port {port} is already "
                 "listening on 0.0.0.0, owned by python3")
    finally:
        squatter.stdin.close()
        try:
            squatter.wait(timeout=10)
        except subprocess.TimeoutExpired:
            squatter.kill()  # our own child, by PID
            squatter.wait(timeout=10)


def test_an_unreachable_host_blocks_naming_it(operator: Operator, faults: Faults) -> None:
    faults.block("eng3", 22)
    _blocked(operator, "node-3: ssh")


def _host_json(operator: Operator, index: int) -> tuple[Path, dict[str, Any]]:
    path = operator.plan.engines()[index].dir / "data" / "host.json"
    return path, dict(json.loads(path.read_text()))


def test_the_image_missing_on_one_host_blocks_naming_it(operator: Operator) -> None:
    path, data = _host_json(operator, 2)
    data["images"] = []  # as if the image was never loaded on eng3
    with _edited(path, json.dumps(data).encode()):
        _blocked(operator, "node-3: NARWHAL_NODE_3_ENGINE_IMAGE: image")


def test_mixed_gpu_products_block(operator: Operator) -> None:
    path, data = _host_json(operator, 1)
    data["hardware"]["accelerators"]["product"] = "NVIDIA A100-SXM4-80GB"
    with _edited(path, json.dumps(data).encode()):
        _blocked(operator, "engines: mixed GPU products")


def test_colocated_engines_sharing_a_gpu_block(operator: Operator) -> None:
    """engine-2 moved onto eng1 with its own ports; it names eng1's GPU 0 by UUID while
    engine-1 names it by index, which the .env check cannot see and discovery must."""
    eng1 = operator.plan.engines()[0]
    assert eng1.host.hardware is not None
    uuid = eng1.host.hardware.accelerators.devices[0].uuid
    ports = {k: str(int(_env_value(operator, f"NARWHAL_{k}")) + 1)
             for k in ("ENGINE_PORT", "ATTEST_PORT", "NIXL_SIDE_CHANNEL_PORT", "KV_EVENTS_PORT")}
    env = operator.variant("colocated", NARWHAL_NODE_2_SSH=_env_value(operator, "NARWHAL_NODE_1_SSH"),
                           NARWHAL_NODE_2_IP=eng1.fabric_ip, NARWHAL_NODE_1_GPU_IDS="0",
                           NARWHAL_NODE_2_GPU_IDS=uuid,
                           **{f"NARWHAL_NODE_2_{k}": v for k, v in ports.items()})
    _blocked(operator, "is also allocated to engine-1", env)


def test_git_missing_on_one_host_blocks_naming_it(operator: Operator, faults: Faults) -> None:
    faults.missing("eng2", "git")
    _blocked(operator, "node-2: git: git is not installed")
    assert subprocess.run(["git", "--version"], capture_output=True, check=False).returncode == 0
    faults.clear()  # the host's git is back once the fault is undone

    def host_git() -> int:
        return subprocess.run([NARWHAL, "lab", "exec", "--host", "eng2", "--", "git",
                               "--version"], capture_output=True, check=False).returncode
    assert host_git() == 0


def test_python_3_10_on_one_host_blocks_naming_it_and_the_version(operator: Operator,
                                                                   faults: Faults) -> None:
    """The probe runs under the host's own python3, which here reports 3.10.12 (the lab's
    interpreter double: no real 3.10 can be installed on Debian 12 from a package index)."""
    faults.python("eng1", "3.10.12")
    try:
        _blocked(operator, "node-1: python3: Python 3.10.12 (needs 3.11 or newer)")
        facts = _facts(operator.last_attempt(), "node-1")
        assert facts["python"]["version"] == "3.10.12"
        assert _facts(operator.last_attempt(), "node-2")["python"]["version"].startswith("3.11.")
    finally:
        faults.clear()
