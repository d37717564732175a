"""Shared builders for the host probe's tests: captured fixtures, tool stand-ins, host dirs.

A stand-in tool is an executable on a private PATH directory: either one of the lab's tool
doubles (the same wrapper the lab installs on its hosts) or a replay of a real capture
(its stdout, stderr and exit status), so the probe runs the command exactly as on a host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from narwhal.lab import identity, spec
from narwhal.lab.spec import Accelerators, Gpu, Hardware, Image

TESTS = Path(__file__).resolve().parents[2]
H200 = TESTS / "fixtures" / "h200-host"
AMD = TESTS / "fixtures" / "amd-host"
CAPTURES = Path(__file__).resolve().parent / "captures"


def _h200_query_fields() -> tuple[str, ...]:
    """The --query-gpu fields the H200 capture was taken with, read from its manifest."""
    commands = json.loads((H200 / "manifest.json").read_text())["commands"]
    argv = next(c["argv"] for c in commands if c["name"] == "nvidia-smi-query-csv-noheader-nounits")
    return tuple(argv[1].split("=", 1)[1].split(","))


H200_FIELDS = _h200_query_fields()
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")
LAB_IMAGE = spec.load(None).image  # the default lab's engine image


def capture(name: str, where: Path = H200) -> tuple[str, str, int]:
    """(stdout, stderr, exit status) of one captured command."""
    return ((where / f"{name}.out").read_text(), (where / f"{name}.err").read_text(),
            int((where / f"{name}.rc").read_text()))


def h200_hardware(numa_node: int | None = None) -> Hardware:
    """The lab spec of the captured H200 host: one GPU with the capture's (redacted) ids, on
    no NUMA node (sysfs says -1: the capture is of a VM)."""
    return Hardware(accelerators=Accelerators(
        vendor="NVIDIA", product="NVIDIA H200", count=1, memory_mib=143771,
        devices=[Gpu(pci_bus_id="00000000:00:06.0", uuid="GPU-00000000-0000-0000-0000-000000000001",
                     numa_node=numa_node)]))


def mi300x_hardware() -> Hardware:
    devices = [Gpu(pci_bus_id=f"00000000:{bus:02X}:00.0", uuid=f"GPU-{i:08x}-0000-4000-8000-00000000000{i}")
               for i, bus in enumerate((0x11, 0x2F))]
    return Hardware(accelerators=Accelerators(vendor="AMD", product="AMD Instinct MI300X", count=2,
                                              memory_mib=196288, devices=devices))


def host_dir(root: Path, hardware: Hardware | None, images: tuple[Image, ...] = ()) -> Path:
    """A lab host's data dir in the layout hostfs writes, read by the tool doubles."""
    data: dict[str, Any] = {"hardware": hardware.model_dump() if hardware else None,
                            "images": [identity.image_document(i) for i in images]}
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "host.json").write_text(json.dumps(data))
    for sub in ("docker", "faults"):
        (root / sub).mkdir(exist_ok=True)
    return root


def install_double(bin_dir: Path, tool: str, module: str, hdir: Path) -> Path:
    """Put the lab's double of tool on bin_dir, as hostfs does on a lab host."""
    path = bin_dir / tool
    bin_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([
        f"#!{sys.executable}",
        "import sys",
        f"from narwhal.lab.doubles.{module} import main",
        f"sys.exit(main({str(hdir)!r}, sys.argv[1:]))",
        ""]))
    path.chmod(0o755)
    return path


def install_replay(bin_dir: Path, tool: str, stdout: str, stderr: str = "", rc: int = 0) -> Path:
    """Put a tool on bin_dir that answers any arguments with a captured reply (needs no PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / tool
    path.write_text("\n".join([
        f"#!{sys.executable} -I",
        "import sys",
        f"sys.stdout.write({stdout!r})",
        f"sys.stderr.write({stderr!r})",
        f"sys.exit({rc})",
        ""]))
    path.chmod(0o755)
    return path


def inject_failure(hdir: Path, tool: str, exit_code: int, stderr: str) -> None:
    """What `narwhal lab fault tool HOST TOOL --exit-code --stderr` writes for the doubles."""
    (hdir / "faults" / f"{tool}.json").write_text(json.dumps({"exit_code": exit_code, "stderr": stderr}))


def sys_pci(root: Path, bus_id: str, numa: str) -> Path:
    """A sysfs-like PCI device with only the numa_node the probe reads."""
    node = root / "bus" / "pci" / "devices" / bus_id
    node.mkdir(parents=True, exist_ok=True)
    (node / "numa_node").write_text(numa + "\n")
    return root
