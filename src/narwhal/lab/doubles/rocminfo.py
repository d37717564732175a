"""rocminfo double: the `Agent N` blocks the ROCm probe splits on, one CPU agent then the GPUs."""

from __future__ import annotations

import sys

from narwhal.lab.doubles.common import host_data, injected_failure

STAR = "*******                  "


def _bdfid(bus_id: str) -> int:
    bus, devfn = bus_id.split(":")[1], bus_id.split(":")[2]
    dev, fn = devfn.split(".")
    return (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)


def _agent(n: int, fields: list[tuple[str, str]]) -> list[str]:
    return [STAR, f"Agent {n}".ljust(25), STAR] + [f"  {k + ':':25}{v}" for k, v in fields]


def main(host_dir: str, argv: list[str]) -> int:
    failed = injected_failure(host_dir, "rocminfo")
    if failed is not None:
        return failed
    acc = host_data(host_dir)["hardware"]["accelerators"]
    out = ["ROCk module version 6.7.0 is loaded", "=====================    ",
           "HSA System Attributes    ", "=====================    ",
           "Runtime Version:         1.14", "Runtime Ext Version:     1.6",
           "Machine Model:           LARGE", "System Endianness:       LITTLE", "",
           "==========               ", "HSA Agents               ", "==========               "]
    out += _agent(1, [("Name", "AMD EPYC 9654 96-Core Processor"), ("Uuid", "CPU-XX"),
                      ("Marketing Name", "AMD EPYC 9654 96-Core Processor"), ("Vendor Name", "CPU"),
                      ("Device Type", "CPU"), ("Node", "0")])
    for i, d in enumerate(acc["devices"]):
        out += _agent(i + 2, [("Name", "gfx942"), ("Uuid", d["uuid"]),
                              ("Marketing Name", acc["product"]), ("Vendor Name", "AMD"),
                              ("Device Type", "GPU"), ("BDFID", str(_bdfid(d["pci_bus_id"]))),
                              ("Node", str(i + 1)), ("Compute Unit", "304"),
                              ("Memory Properties", ""), ("Size", f"{acc['memory_mib'] * 1024}(0x0) KB")])
    out.append("*** Done ***")
    sys.stdout.write("\n".join(out) + "\n")
    return 0
