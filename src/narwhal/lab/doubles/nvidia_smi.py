"""nvidia-smi double: `--query-gpu ... --format=csv[,noheader][,nounits]`, `-L`, `-q -x`.

Field names, header units, cell formats, XML element paths and the error texts and exit statuses
of operator mistakes follow nvidia-smi 580 as captured on a real H200 host
(tests/fixtures/h200-host; tests/unit/test_nvidia_smi_double_fidelity.py holds the double to it).
"""

from __future__ import annotations

import sys
import time
from typing import Any
from xml.sax.saxutils import escape

from narwhal.lab.doubles.common import host_data, injected_failure

DRIVER = "580.159.04"
CUDA = "13.0"
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB"}


def _gpus(data: dict[str, Any]) -> list[dict[str, Any]]:
    acc = data["hardware"]["accelerators"]
    return [
        {"index": i, "name": acc["product"], "uuid": d["uuid"], "pci.bus_id": d["pci_bus_id"],
         "memory.total": acc["memory_mib"], "memory.used": 0, "memory.free": acc["memory_mib"],
         "driver_version": DRIVER, "count": acc["count"], "serial": f"165{i:010d}",
         "compute_cap": "9.0", "pci.domain": "0x0000", "pci.bus": "0x" + d["pci_bus_id"][9:11]}
        for i, d in enumerate(acc["devices"])
    ]


def _query(gpus: list[dict[str, Any]], fields: list[str], fmt: set[str]) -> int:
    for f in fields:
        if f not in gpus[0]:
            print(f'Field "{f}" is not a valid field to query.', file=sys.stdout)
            print("\nSee 'nvidia-smi --help-query-gpu' for more information.")
            return 2
    # Real nvidia-smi 580 answers in CSV whatever --format names (noheader/nounits still apply).
    if "noheader" not in fmt:
        print(", ".join(f + (f" [{UNITS[f]}]" if f in UNITS and "nounits" not in fmt else "")
                        for f in fields))
    for g in gpus:
        cells = [f"{g[f]} {UNITS[f]}" if f in UNITS and "nounits" not in fmt else str(g[f])
                 for f in fields]
        print(", ".join(cells))
    return 0


def _xml(gpus: list[dict[str, Any]]) -> str:
    out = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
           "<nvidia_smi_log>", f"\t<timestamp>{time.strftime('%a %b %d %H:%M:%S %Y')}</timestamp>",
           f"\t<driver_version>{DRIVER}</driver_version>", f"\t<cuda_version>{CUDA}</cuda_version>",
           f"\t<attached_gpus>{len(gpus)}</attached_gpus>"]
    for g in gpus:
        bus = g["pci.bus_id"]
        out += [f'\t<gpu id="{bus}">', f"\t\t<product_name>{escape(g['name'])}</product_name>",
                "\t\t<product_brand>NVIDIA</product_brand>",
                "\t\t<product_architecture>Hopper</product_architecture>",
                f"\t\t<serial>{g['serial']}</serial>", f"\t\t<uuid>{g['uuid']}</uuid>",
                f"\t\t<minor_number>{g['index']}</minor_number>",
                "\t\t<pci>", f"\t\t\t<pci_bus>{bus[9:11]}</pci_bus>", "\t\t\t<pci_device>00</pci_device>",
                "\t\t\t<pci_domain>0000</pci_domain>", "\t\t\t<pci_device_id>233010DE</pci_device_id>",
                f"\t\t\t<pci_bus_id>{bus}</pci_bus_id>", "\t\t</pci>",
                "\t\t<fb_memory_usage>", f"\t\t\t<total>{g['memory.total']} MiB</total>",
                "\t\t\t<reserved>0 MiB</reserved>", f"\t\t\t<used>{g['memory.used']} MiB</used>",
                f"\t\t\t<free>{g['memory.free']} MiB</free>", "\t\t</fb_memory_usage>",
                "\t\t<processes>", "\t\t</processes>", "\t</gpu>"]
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


def _table(gpus: list[dict[str, Any]]) -> str:
    lines = [time.strftime("%a %b %d %H:%M:%S %Y"),
             "+" + "-" * 91 + "+",
             f"| NVIDIA-SMI {DRIVER}              Driver Version: {DRIVER}      CUDA Version: {CUDA}     |",
             "|" + "-" * 91 + "|"]
    for g in gpus:
        lines.append(f"| {g['index']:>3}  {g['name'][:30]:30}  {g['pci.bus_id']}   "
                     f"{g['memory.used']:>6}MiB / {g['memory.total']:>6}MiB |")
    lines.append("+" + "-" * 91 + "+")
    return "\n".join(lines) + "\n"


def main(host_dir: str, argv: list[str]) -> int:
    failed = injected_failure(host_dir, "nvidia-smi")
    if failed is not None:
        return failed
    gpus = _gpus(host_data(host_dir))
    fields: list[str] = []
    fmt: set[str] = set()
    xml = query_all = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--query-gpu="):
            fields = a.split("=", 1)[1].split(",")
        elif a.startswith("--format="):
            fmt = set(a.split("=", 1)[1].split(","))
        elif a in ("-i", "--id"):
            i += 1
            wanted = set(argv[i].split(","))
            gpus = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]
        elif a in ("-x", "--xml-format"):
            xml = True
        elif a in ("-q", "--query"):
            query_all = True
        elif a in ("-L", "--list-gpus"):
            if any(x in ("-i", "--id") for x in argv):
                print("ERROR: Option -i is not valid for this command. Please run 'nvidia-smi -h' for help.\n")
                return 2
            for g in gpus:
                print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
            return 0
        else:
            print(f"ERROR: Option {a} is not recognized. Please run 'nvidia-smi -h'.\n")
            return 255
        i += 1
    if not gpus:
        print("No devices were found")
        return 6
    if fields:
        return _query(gpus, fields, fmt)
    if query_all and xml:
        sys.stdout.write(_xml(gpus))
        return 0
    sys.stdout.write(_table(gpus))
    return 0
