"""What one perftest `ib_write_bw ... --report_gbits` client run says: the average rate, or why
it did not run. The number is parsed from perftest's own report, never typed by hand.

perftest prints a header (device, link type, GID index, MTU) and one result row under
` #bytes  #iterations  BW peak[Gb/sec]  BW average[Gb/sec]  MsgRate[Mpps]`; without an RDMA
device it says so ("Did not detect devices") and exits non-zero; a server that is not there
is "Couldn't connect to HOST:PORT".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from narwhal.deploy.fabric.iperf import IperfError

_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>Gb/sec|MB/sec)\]\s+"
                     r"BW average\[(?P=unit)\]")
_ROW = re.compile(r"^\s*(?P<bytes>\d+)\s+(?P<iters>\d+)\s+(?P<peak>[0-9.]+)\s+"
                  r"(?P<avg>[0-9.]+)\s+(?P<rate>[0-9.]+)\s*$")
_FIELD = re.compile(r"(?<![A-Za-z-])(?P<key>Device|Link type|GID index|Mtu)\s*:\s*(?P<value>\S+)")
MAX_REPORT_CHARS = 1 << 20


@dataclass(frozen=True)
class PerftestSample:
    gbps: float  # BW average, decimal Gbit/s
    message_bytes: int
    iterations: int
    device: str
    link_type: str
    gid_index: str


def parse(stdout: str, stderr: str, exit_status: int) -> PerftestSample | IperfError:
    """The client's report (ValueError when it is neither a report nor a known failure)."""
    text = (stdout + "\n" + stderr)[-MAX_REPORT_CHARS:]
    if "Did not detect devices" in text or "Unable to find the Infiniband/RoCE device" in text:
        return IperfError("no_device", "perftest found no RDMA device on the host")
    if "Couldn't connect to" in text:
        line = next(ln for ln in text.splitlines() if "Couldn't connect to" in ln)
        refused = "refused" in text.lower()
        return IperfError("refused" if refused else "timed_out", line.strip()[:300])
    header = _HEADER.search(stdout)
    if header is None:
        if exit_status != 0:
            return IperfError("other", f"ib_write_bw exited {exit_status}: "
                              + (stderr.strip() or stdout.strip())[-300:])
        raise ValueError("ib_write_bw printed no BW average row")
    fields = {m["key"]: m["value"] for ln in stdout.splitlines() for m in _FIELD.finditer(ln)}
    row = next((m for ln in stdout[header.end():].splitlines() if (m := _ROW.match(ln))), None)
    if row is None:
        raise ValueError("ib_write_bw's BW average row is not numbers")
    avg = float(row["avg"])
    gbps = avg if header["unit"] == "Gb/sec" else avg * 1048576 * 8 / 1e9
    return PerftestSample(gbps, int(row["bytes"]), int(row["iters"]), fields.get("Device", ""),
                          fields.get("Link type", ""),
                          fields.get("GID index", ""))
