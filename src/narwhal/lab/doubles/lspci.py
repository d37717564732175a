"""lspci double: the host's accelerators in lspci's default, -D, -n and -nn forms."""

from __future__ import annotations

from narwhal.lab.doubles.common import host_data, injected_failure

NAMES = {
    "NVIDIA": ("3D controller", "NVIDIA Corporation", "GH100 [H100 SXM5 80GB]", "0302", "10de", "2330"),
    "AMD": ("Processing accelerators", "Advanced Micro Devices, Inc. [AMD/ATI]",
            "Aqua Vanjaram [Instinct MI300X]", "1200", "1002", "74a1"),
}


def main(host_dir: str, argv: list[str]) -> int:
    failed = injected_failure(host_dir, "lspci")
    if failed is not None:
        return failed
    hw = host_data(host_dir)["hardware"]
    if not hw:
        return 0
    acc = hw["accelerators"]
    klass, vendor, device, code, vid, did = NAMES[acc["vendor"]]
    for d in acc["devices"]:
        domain, rest = d["pci_bus_id"].split(":", 1)
        slot = (f"{int(domain, 16):04x}:" if "-D" in argv else "") + rest.lower()
        if "-nn" in argv:
            print(f"{slot} {klass} [{code}]: {vendor} {device} [{vid}:{did}] (rev a1)")
        elif "-n" in argv:
            print(f"{slot} {code}: {vid}:{did} (rev a1)")
        else:
            print(f"{slot} {klass}: {vendor} {device} (rev a1)")
    return 0
