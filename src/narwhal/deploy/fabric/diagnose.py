"""Why a directed edge fell short: the runbook's list, each cause from a measured fact.

The runbook's correction for a fabric miss is "diagnose route, binding, listener, firewall,
HCA/GID, MTU, retransmissions or RDMA counters, CPU saturation, concurrent traffic; re-sample
only after root cause is identified". Every cause here is read from the link record or the
sample itself, so the diagnosis is recorded with the failing sample, before any resample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from narwhal.deploy.fabric.iperf import IperfError, IperfSample
from narwhal.deploy.fabric.links import LinkRecord
from narwhal.deploy.fabric.perftest import PerftestSample

RETRANSMIT_SHARE = 0.005  # above 0.5 % of segments resent, loss on the path is a cause
CPU_SATURATED_PERCENT = 90.0


@dataclass(frozen=True)
class Cause:
    cause: str  # route, mtu, listener, firewall, busy, retransmissions, cpu, traffic, capacity
    found: str
    fix: str

    def document(self) -> dict[str, str]:
        return {"cause": self.cause, "found": self.found, "fix": self.fix}


@dataclass(frozen=True)
class Outcome:
    """What one attempt to sample an edge produced."""

    sample: IperfSample | PerftestSample | None = None
    error: IperfError | None = None
    listening: bool = False  # the consumer's test server was listening when the client ran
    port_owner: str | None = None  # a listener already on the test port before we started
    traffic: list[str] = field(default_factory=list)  # engines not idle around the sample


def diagnose(link: LinkRecord, out: Outcome, required_gbps: float, port: int) -> list[Cause]:
    causes = [Cause("route", p, "route the peer's fabric address over the fabric interface "
                    "(ip route), or fix the address in the .env")
              for p in link.route_problems()]
    mtu = link.mtu_mismatch()
    if mtu:
        causes.append(Cause("mtu", mtu, "set the same MTU on both ends of the fabric"))
    dst = f"{link.destination} {link.destination_address}:{port}"
    if out.port_owner:
        causes.append(Cause("listener", f"port {port} on {link.destination} is held by "
                            f"{out.port_owner}", "free the port, or pick another with "
                            "--port"))
    if out.error is not None:
        e = out.error
        if e.kind == "refused" and out.listening:
            causes.append(Cause("firewall", f"{dst} refused the connection while the test "
                                f"server listened ({e.message})", f"allow TCP {port} in on "
                                f"{link.destination} from {link.source_address}"))
        elif e.kind == "refused":
            causes.append(Cause("listener", f"nothing listened on {dst} ({e.message})",
                                "check the test server's log in the attempt's commands"))
        elif e.kind == "timed_out":
            causes.append(Cause("firewall", f"connecting to {dst} timed out: packets are "
                                f"dropped ({e.message})", f"allow TCP {port} in on "
                                f"{link.destination}, or fix the route"))
        elif e.kind == "no_device":
            causes.append(Cause("hca", f"{e.message} (the edge's transport is RDMA)",
                                "check the HCA and its port (ibv_devinfo) on both hosts, and "
                                "TRANSFER_NET_DEVICES in the .env"))
        elif e.kind == "busy":
            causes.append(Cause("busy", f"the test server on {dst} was busy ({e.message})",
                                "another test ran at the same time: keep the fabric to one "
                                "test at a time"))
        else:
            causes.append(Cause(e.kind, e.message, "read the client's output in the sample"))
    if out.traffic:
        causes.append(Cause("traffic", "engines were not idle around the sample: "
                            + "; ".join(out.traffic), "stop the load on the engines, then "
                            "run `narwhal fabric` again"))
    s = out.sample
    if isinstance(s, IperfSample):  # TCP: the kernel counts resent segments, and both CPUs
        if s.retransmitted_share > RETRANSMIT_SHARE:
            causes.append(Cause("retransmissions", f"{s.retransmits} segments retransmitted "
                                f"({s.retransmitted_share:.1%} of those sent): packets are lost "
                                "on the path", "check the link's error and drop counters "
                                "(ip -s link, ethtool -S) on both ends and the switch"))
        for host, cpu in ((link.source, s.cpu_local_percent),
                          (link.destination, s.cpu_remote_percent)):
            if cpu >= CPU_SATURATED_PERCENT:
                causes.append(Cause("cpu", f"{host} CPU at {cpu:.0f} % during the sample: the "
                                    "host, not the link, set the rate", "run the sample with "
                                    "the host otherwise idle, or with more parallel streams"))
    if s is not None and not causes and s.gbps < required_gbps:
        causes.append(Cause("capacity", f"{s.gbps:.3f} Gbit/s with the route on the fabric, "
                            "one MTU, no retransmissions to speak of and idle CPUs: the "
                            "link itself carries less than the budget",
                            "check the link speed (ethtool), shaping or a policer on the "
                            "path; or lower the workload"))
    return causes


def document(edge: str, causes: list[Cause], sample_artifact: str | None) -> dict[str, Any]:
    return {"edge": edge, "sample": sample_artifact,
            "causes": [c.document() for c in causes]}
