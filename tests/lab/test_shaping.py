"""A shaped directed fabric edge caps that direction only, as iperf3 over SSH sees it."""

from __future__ import annotations

import json

import pytest

from narwhal.lab.faults import Faults
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

CAP_MBIT = 200


def _iperf(lab: LabPlan, src: str, dst: str) -> float:
    """Mbit/s received on dst from src over the fabric, measured by iperf3 -J (1 s)."""
    s, d = lab.host(src), lab.host(dst)
    started = ssh(lab, dst, f"iperf3 -s -1 -B {d.fabric_ip} -D --pidfile /tmp/iperf3.pid")
    assert started.returncode == 0, started.stderr
    out = ssh(lab, src, f"sleep 0.2; iperf3 -c {d.fabric_ip} -B {s.fabric_ip} -t 1 -J")
    report = json.loads(out.stdout)
    assert "error" not in report, report.get("error")
    return float(report["end"]["sum_received"]["bits_per_second"]) / 1e6


@pytest.mark.lab
def test_shaped_edge_is_capped_in_its_direction_only(faults: Faults) -> None:
    lab = faults.plan
    faults.shape("eng1", "eng2", f"{CAP_MBIT}mbit")
    forward = _iperf(lab, "eng1", "eng2")
    reverse = _iperf(lab, "eng2", "eng1")
    assert forward <= CAP_MBIT * 1.1, forward
    assert forward >= CAP_MBIT * 0.5, forward  # the edge still carries traffic
    assert reverse > CAP_MBIT * 2, reverse


@pytest.mark.lab
def test_clearing_the_fault_removes_the_cap(faults: Faults) -> None:
    faults.shape("eng1", "eng2", "50mbit")
    faults.clear()
    assert _iperf(faults.plan, "eng1", "eng2") > 100
