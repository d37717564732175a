"""What one `iperf3 --client ... --json` run says: the rate, retransmissions, CPU of both ends,
or why it did not run.

iperf3 exits 0 even when it never connected; the JSON's `error` key is the verdict. A refused
connection (nothing listens, or a firewall rejects) and one that timed out (packets dropped)
point at different causes, so the error is classified, never passed on as a bare string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ErrorKind = Literal["refused", "timed_out", "busy", "unreachable", "no_device", "other"]
MAX_REPORT_BYTES = 8 << 20  # a 10 s run with intervals is ~30 KB; more is not a report


@dataclass(frozen=True)
class IperfSample:
    """A completed run: received rate and what the diagnosis needs."""

    gbps: float  # decimal Gbit/s the receiver got (end.sum_received)
    seconds: float
    bytes: int
    retransmits: int
    mss: int  # the sender's TCP MSS, to express retransmits as a share of the segments
    cpu_local_percent: float  # the client (producer) host
    cpu_remote_percent: float  # the server (consumer) host
    version: str

    @property
    def retransmitted_share(self) -> float:
        """Retransmitted segments over segments sent (0 when nothing was sent)."""
        segments = self.bytes / self.mss if self.mss > 0 else 0.0
        return self.retransmits / segments if segments > 0 else 0.0


@dataclass(frozen=True)
class IperfError:
    kind: ErrorKind
    message: str


def classify(message: str) -> ErrorKind:
    text = message.lower()
    if "connection refused" in text:
        return "refused"
    if "timed out" in text or "timeout" in text or "operation now in progress" in text:
        return "timed_out"
    if "busy" in text:
        return "busy"
    if "no route to host" in text or "network is unreachable" in text:
        return "unreachable"
    return "other"


def _number(doc: dict[str, Any], *path: str) -> float:
    value: Any = doc
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"iperf3 report has no {'.'.join(path)}")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"iperf3 report's {'.'.join(path)} is not a number")
    return float(value)


def parse(text: str) -> IperfSample | IperfError:
    """The report of one client run (ValueError when it is not an iperf3 JSON report)."""
    if len(text) > MAX_REPORT_BYTES:
        raise ValueError(f"iperf3 report is larger than {MAX_REPORT_BYTES} bytes")
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(f"iperf3 did not print a JSON report: {text.strip()[:200]!r}") from None
    if not isinstance(doc, dict):
        raise ValueError("iperf3 report is not a JSON object")
    if "error" in doc:
        message = str(doc["error"])[:500]
        return IperfError(classify(message), message)
    start = doc.get("start") if isinstance(doc.get("start"), dict) else {}
    assert isinstance(start, dict)
    if (start.get("test_start") or {}).get("protocol") not in (None, "TCP"):
        raise ValueError("iperf3 report is not of a TCP test")
    seconds = _number(doc, "end", "sum_received", "seconds")
    if seconds <= 0:
        raise ValueError("iperf3 report received for 0 seconds")
    return IperfSample(
        gbps=_number(doc, "end", "sum_received", "bits_per_second") / 1e9, seconds=seconds,
        bytes=int(_number(doc, "end", "sum_sent", "bytes")),
        retransmits=int(_number(doc, "end", "sum_sent", "retransmits")),
        mss=int(start.get("tcp_mss_default") or 0) if isinstance(
            start.get("tcp_mss_default"), int) else 0,
        cpu_local_percent=_number(doc, "end", "cpu_utilization_percent", "host_total"),
        cpu_remote_percent=_number(doc, "end", "cpu_utilization_percent", "remote_total"),
        version=str(start.get("version", "")))
