"""The captured H200 host and a lab host built from its spec give one host-facts document.

Discovery in the lab is worth something only if a lab host reads, through the same probe, as
the real host it stands for. Here both are probed by the real collectors: the H200 side
answers from the capture (nvidia-smi's reply projected onto the probe's own --query-gpu
fields, its PCI sysfs line and its /dev listing), the lab side from what the lab lays out
for the same spec (hostfs's device nodes and PCI sysfs, the nvidia-smi double). Both are
then read by the workstation's parser (core/host_facts) and compared whole.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from narwhal.core.host_facts import parse_host_facts
from narwhal.lab import hostfs
from narwhal.lab.plan import HostPlan
from narwhal.lab.spec import Host
from narwhal.node import host_probe as hp
from tests.unit.node.helpers import H200_FIELDS, capture, h200_hardware, host_dir, install_double

WORKSTATION_REQUEST = {"schema": "narwhal.host-probe-request", "schema_version": 1,
                       "role": "engine", "run_dir": None, "model_dir": None,
                       "fabric_interface": None, "ports": [], "image": None, "runtime": None,
                       "hash_model": False}


def _capture_nvidia_smi(bin_dir: Path) -> Path:
    """nvidia-smi answering any --query-gpu with the capture's columns for those fields."""
    out = capture("nvidia-smi-query-csv-noheader-nounits")[0]
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line]
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text("\n".join([
        f"#!{sys.executable} -I",
        "import sys",
        f"fields, rows = {list(H200_FIELDS)!r}, {rows!r}",
        "query = next(a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith('--query-gpu='))",
        "cols = [fields.index(f) for f in query.split(',')]  # a field not captured fails loudly",
        "for row in rows:",
        "    print(', '.join(row[c] for c in cols))",
        ""]))
    tool.chmod(0o755)
    return tool


def _capture_host(root: Path) -> tuple[Path, Path, Path]:
    """(nvidia-smi, sys root, dev root) of the captured H200, rebuilt from its files."""
    line = capture("sys-pci-nvidia")[0].split()
    bus_id, attrs = line[0], dict(a.split("=", 1) for a in line[1:])
    node = root / "sys" / "bus" / "pci" / "devices" / bus_id
    node.mkdir(parents=True)
    for key, value in (("vendor", "0x10de"), ("class", attrs["class"]),
                       ("device", attrs["device"]), ("numa_node", attrs["numa"])):
        (node / key).write_text(value + "\n")
    dev = root / "dev"
    dev.mkdir()
    for name in capture("dev-nvidia")[0].split():
        if name == "nvidia-caps":  # listed as a folder; the driver's two MIG capability nodes
            (dev / name).mkdir()
            for cap in ("nvidia-cap1", "nvidia-cap2"):
                (dev / name / cap).write_text("")
        else:
            (dev / name).write_text("")
    return _capture_nvidia_smi(root / "bin"), root / "sys", dev


def _lab_host(root: Path) -> tuple[Path, Path, Path]:
    """(nvidia-smi, sys root, dev root) as the lab builds a host with the H200's spec."""
    h = HostPlan(host=Host(name="h200", role="engine", hardware=h200_hardware()),
                 index=0, netns="unused", mgmt_ip="unused", fabric_ip="unused", dir=root / "host")
    hostfs.devices_and_pci(h)
    host_dir(h.dir, h.host.hardware)
    devices = root / "sys" / "bus" / "pci"
    devices.mkdir(parents=True)
    (devices / "devices").symlink_to(h.dir / "pci")  # boot.py binds it at that place
    return install_double(root / "bin", "nvidia-smi", "nvidia_smi", h.dir), root / "sys", \
        h.dir / "dev"


def _document(base: dict[str, Any], tool: Path, sys_root: Path, dev: Path) -> dict[str, Any]:
    tools: dict[str, dict[str, str | None]] = {n: {"path": None, "version": None} for n in hp.TOOLS}
    tools["nvidia-smi"]["path"] = str(tool)
    doc = dict(base, accelerators=hp.accelerator_facts(tools, str(sys_root), str(dev)),
               device_nodes=hp.device_nodes(str(dev)))
    return dict(parse_host_facts(doc, "h200").model_dump(mode="json", by_alias=True))


def test_the_h200_capture_and_its_lab_double_give_the_same_host_facts(tmp_path: Path) -> None:
    base = hp.host_facts(WORKSTATION_REQUEST)  # the rest of the document: this machine's
    real = _document(base, *_capture_host(tmp_path / "real"))
    lab = _document(base, *_lab_host(tmp_path / "lab"))
    assert real == lab
    gpu = real["accelerators"]["gpus"][0]
    assert gpu == {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-000000000001",
                   "pci_bus_id": "0000:00:06.0", "memory_total_mib": 143771, "numa_node": None,
                   "render_node": None}
    assert real["accelerators"]["driver_version"] == "580.159.04"
    assert real["device_nodes"] == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
                                    "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0",
                                    "/dev/nvidiactl"]


def test_a_lab_gpu_on_a_numa_node_reads_as_that_node_unlike_the_vm_capture(tmp_path: Path) -> None:
    """The comparison above is not vacuous: the lab's own default (NUMA node 0) differs."""
    h = HostPlan(host=Host(name="h200", role="engine", hardware=h200_hardware(0)), index=0,
                 netns="unused", mgmt_ip="unused", fabric_ip="unused", dir=tmp_path / "host")
    hostfs.devices_and_pci(h)
    node = next((h.dir / "pci").iterdir())
    assert re.fullmatch(r"0000:00:06\.0", node.name)
    assert (node / "numa_node").read_text() == "0\n"
