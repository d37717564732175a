"""Capture what Gate A's host inspection reads on a real GPU host, redacted before it leaves.

Run on an accelerator host (stdlib only, Python 3.8+): `python3 scripts/device/host_probe.py OUTDIR`.
Each inspection command's stdout, stderr and exit status land in OUTDIR/<name>.{out,err,rc};
OUTDIR/manifest.json lists them. Nothing raw is ever written: identifiers that name one
physical machine (GPU UUIDs and serials, board serials, MAC and IP addresses, the host name,
the machine id) are replaced by stable aliases *before* the first byte is written, so the
capture can be committed as a fixture. PCI bus ids, product names, driver versions and
memory sizes are kept: they are what the lab doubles and the discovery parsers must match.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import ClassVar

QUERY_FIELDS = (
    "index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,count,"
    "serial,compute_cap,pci.domain,pci.bus"
)

COMMANDS: dict[str, list[str]] = {
    "nvidia-smi": ["nvidia-smi"],
    "nvidia-smi-L": ["nvidia-smi", "-L"],
    "nvidia-smi-q-x": ["nvidia-smi", "-q", "-x"],
    "nvidia-smi-query-csv": ["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv"],
    "nvidia-smi-query-csv-noheader-nounits": [
        "nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits"],
    "nvidia-smi-query-unknown-field": [
        "nvidia-smi", "--query-gpu=index,no.such.field", "--format=csv"],
    "nvidia-smi-query-no-csv": ["nvidia-smi", "--query-gpu=index", "--format=noheader"],
    "nvidia-smi-bad-flag": ["nvidia-smi", "--no-such-flag"],
    "nvidia-smi-i-missing": ["nvidia-smi", "-i", "7", "-L"],
    "nvidia-smi-topo-m": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-help-query-gpu": ["nvidia-smi", "--help-query-gpu"],
    "lspci-D-nn": ["lspci", "-D", "-nn"],
    "lspci": ["lspci"],
    "nproc": ["nproc"],
    "uname-srm": ["uname", "-srm"],
    "os-release": ["cat", "/etc/os-release"],
    "meminfo": ["cat", "/proc/meminfo"],
    "lscpu": ["lscpu"],
    "df-P": ["df", "-P", "/"],
    "ip-j-addr": ["ip", "-j", "addr"],
    "ip-route": ["ip", "route"],
    "tools": ["sh", "-c", "for t in nvidia-smi lspci docker podman ibv_devinfo ib_write_bw iperf3 "
              "sshd rocminfo nvcc python3; do printf '%s ' $t; command -v $t || echo MISSING; done"],
    "sys-pci-nvidia": ["sh", "-c", "for d in /sys/bus/pci/devices/*; do "
                       "[ \"$(cat $d/vendor 2>/dev/null)\" = 0x10de ] || continue; "
                       "echo \"$(basename $d) class=$(cat $d/class) device=$(cat $d/device) "
                       "numa=$(cat $d/numa_node 2>/dev/null) driver=$(basename $(readlink $d/driver) "
                       "2>/dev/null)\"; done"],
    "dev-nvidia": ["sh", "-c", "ls -1 /dev | grep -E '^nvidia' || true"],
    "cuda-visible-devices": ["sh", "-c", "echo \"CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}\""],
    "nvcc-version": ["nvcc", "--version"],
    "torch-device": ["python3", "-c",
                     "import json,torch;p=torch.cuda.get_device_properties(0);"
                     "print(json.dumps({'torch':torch.__version__,'cuda':torch.version.cuda,"
                     "'count':torch.cuda.device_count(),'name':p.name,'total_memory':p.total_memory,"
                     "'major':p.major,'minor':p.minor,'multi_processor_count':p.multi_processor_count}))"],
}


class Redactor:
    """Replace machine-identifying strings with aliases that stay stable across every file."""

    PATTERNS = (
        ("gpu-uuid", re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")),
        ("mig-uuid", re.compile(r"MIG-[0-9a-fA-F-]{36}")),
        ("mac", re.compile(r"(?<![0-9a-fA-F:])(?:[0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}(?![0-9a-fA-F:])")),
        ("ipv4", re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")),
        # Full eight-group form, or a compressed form with "::"; times (15:21:03) and PCI ids
        # (0000:00:06.0) have neither and must survive.
        ("ipv6", re.compile(r"(?<![0-9a-fA-F:])(?:(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}"
                            r"|(?:[0-9a-fA-F]{1,4}:){1,6}:(?:[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4})*)?"
                            r"|::[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4})*)(?![0-9a-fA-F:])")),
    )
    # One pass over all kinds, so an alias written for one kind is never re-read as another.
    COMBINED = re.compile("|".join(f"(?P<{k.replace('-', '_')}>{p.pattern})" for k, p in PATTERNS))
    KEEP_IPV4: ClassVar[frozenset[str]] = frozenset({"127.0.0.1", "0.0.0.0", "255.255.255.255"})  # noqa: S104
    SERIAL_XML = re.compile(r"<(serial|board_id|module_id|gpu_fru_part_number|pdi|chassis_serial_number|host_id|gpu_fabric_guid)>([^<]*)</\1>")
    SERIAL_TEXT = re.compile(r"^(\s*(?:Serial Number|Board ID|Module ID)\s*:\s*)(\S.*)$", re.M)

    def __init__(self, hostname: str, machine_id: str) -> None:
        self.aliases: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.literals = [s for s in {hostname, hostname.split(".")[0], machine_id} if len(s) >= 4]

    def _alias(self, kind: str, value: str) -> str:
        if value not in self.aliases:
            n = self.counts.get(kind, 0) + 1
            self.counts[kind] = n
            self.aliases[value] = {
                "gpu-uuid": f"GPU-00000000-0000-0000-0000-{n:012d}",
                "mig-uuid": f"MIG-00000000-0000-0000-0000-{n:012d}",
                "mac": f"02:00:00:00:00:{n:02x}",
                "ipv4": f"192.0.2.{n}",
                "ipv6": f"2001:db8::{n:x}",
            }.get(kind, f"redacted-{kind}-{n}")
        return self.aliases[value]

    def __call__(self, text: str) -> str:
        for literal in self.literals:
            text = text.replace(literal, "redacted-host")
        text = self.SERIAL_XML.sub(lambda m: f"<{m[1]}>{self._alias(m[1], m[2])}</{m[1]}>", text)
        text = self.SERIAL_TEXT.sub(lambda m: m[1] + self._alias("serial", m[2]), text)
        return self.COMBINED.sub(self._swap, text)

    def csv_columns(self, text: str, fields: list[str]) -> str:
        """Alias the serial column of `--query-gpu` CSV output, which has no label to match on."""
        if "serial" not in fields:
            return text
        col = fields.index("serial")
        rows = []
        for line in text.splitlines(keepends=True):
            cells = line.rstrip("\n").split(", ")
            if len(cells) == len(fields) and cells[col] != "serial":
                cells[col] = self._alias("serial", cells[col])
                line = ", ".join(cells) + ("\n" if line.endswith("\n") else "")
            rows.append(line)
        return "".join(rows)

    def _swap(self, m: re.Match[str]) -> str:
        kind, value = m.lastgroup or "", m[0]
        if kind == "ipv4" and (value in self.KEEP_IPV4 or value.startswith("127.")):
            return value
        if kind == "ipv6" and value in ("::1", "::"):
            return value
        if kind == "mac" and value == "00:00:00:00:00:00":
            return value
        return self._alias(kind.replace("_", "-"), value)


def main(outdir: str) -> int:
    os.makedirs(outdir, exist_ok=True)
    try:
        with open("/etc/machine-id") as f:
            machine_id = f.read().strip()
    except OSError:
        machine_id = ""
    redact = Redactor(socket.gethostname(), machine_id)
    manifest = []
    for name, argv in COMMANDS.items():
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, errors="replace")
            out, err, rc = done.stdout, done.stderr, done.returncode
        except FileNotFoundError:
            out, err, rc = "", f"{argv[0]}: command not found\n", 127
        except subprocess.TimeoutExpired:
            out, err, rc = "", "timed out after 60 s\n", 124
        query = [a.split("=", 1)[1].split(",") for a in argv if a.startswith("--query-gpu=")]
        out = redact.csv_columns(out, query[0]) if query else out
        for suffix, body in ((".out", redact(out)), (".err", redact(err)), (".rc", f"{rc}\n")):
            with open(os.path.join(outdir, name + suffix), "w") as f:
                f.write(body)
        manifest.append({"name": name, "argv": [redact(a) for a in argv], "rc": rc,
                         "seconds": round(time.monotonic() - started, 3)})
        print(f"{name}: rc={rc}", flush=True)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"captured": time.strftime("%Y-%m-%d"), "redacted_kinds": sorted(redact.counts),
                   "commands": manifest}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
