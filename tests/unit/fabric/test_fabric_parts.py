"""Gate D's pure parts: iperf3 reports as iperf3 3.12 prints them, link facts from `ip -j`,
the budget through the gate's own path, the diagnosis of a miss, and the idle proof."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.kv.budget import uniform_payload
from narwhal.deploy.fabric import diagnose as dx
from narwhal.deploy.fabric import iperf
from narwhal.deploy.fabric.budget import payload_budget
from narwhal.deploy.fabric.links import Interface, LinkRecord, Route, parse_interface, parse_route
from narwhal.deploy.fabric.matrix import EdgeRow, heatmap_png, row_from
from narwhal.deploy.gates.fabric import Fabric
from narwhal.deploy.inputs.model import Workload

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "iperf3"


def test_a_real_report_gives_the_received_rate_retransmits_and_both_cpus() -> None:
    s = iperf.parse((FIXTURES / "loopback-1s.json").read_text())
    assert isinstance(s, iperf.IperfSample)
    assert s.gbps == pytest.approx(8236123810.667973 / 1e9)
    assert s.retransmits == 8 and s.mss == 32768 and s.version == "iperf 3.12"
    assert s.cpu_local_percent == pytest.approx(20.026, abs=1e-3)
    assert s.cpu_remote_percent == pytest.approx(21.547, abs=1e-3)
    assert s.retransmitted_share < dx.RETRANSMIT_SHARE  # 8 of ~32000 segments


def test_a_refused_connection_exits_0_but_is_an_error_by_its_json() -> None:
    e = iperf.parse((FIXTURES / "refused.json").read_text())
    assert e == iperf.IperfError("refused", "unable to connect to server: Connection refused")


@pytest.mark.parametrize(("message", "kind"), [
    ("unable to connect to server - server may have stopped running or use a different port, "
     "firewall issue, etc.: Connection timed out", "timed_out"),
    ("the server is busy running a test. try again later", "busy"),
    ("unable to connect to server: No route to host", "unreachable"),
    ("control socket has closed unexpectedly", "other"),
])
def test_errors_are_classified_by_what_they_point_at(message: str, kind: str) -> None:
    assert iperf.parse(json.dumps({"start": {}, "error": message})) == iperf.IperfError(
        kind, message)


@pytest.mark.parametrize("text", [
    "", "iperf3: error - unable to connect", "[]", json.dumps({"end": {}}),
    json.dumps({"end": {"sum_received": {"seconds": 0, "bits_per_second": 1}}}),
    json.dumps({"end": {"sum_received": {"seconds": 1, "bits_per_second": "fast"}}}),
    json.dumps({"start": {"test_start": {"protocol": "UDP"}}}),
    " " * (iperf.MAX_REPORT_BYTES + 1),
])
def test_what_is_not_a_tcp_report_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="iperf3"):
        iperf.parse(text)


def test_the_anchor_vector_through_the_gates_own_workload() -> None:
    """1000 B/token, 129 prompt tokens in 128-token blocks, 1 handoff/s, 2 arriving at once
    within 0.5 s, headroom 1.25 -> 0.01024 Gbit/s (narwhal-inference 0.7.0's vector)."""
    w = Workload(prompt_tokens=129, handoffs_per_s=1.0, burst=2, transfer_budget_ms=500.0,
                 headroom=1.25)
    b = payload_budget(uniform_payload(1000, w.prompt_tokens, 128), w)
    assert b.payload_bytes_per_handoff == 256_000 and b.peak_handoffs_per_s == 4.0
    assert b.required_gbps == pytest.approx(0.01024)


IP_ADDR = json.dumps([{"ifindex": 3, "ifname": "fab0", "flags": ["BROADCAST", "UP"],
                       "mtu": 9000, "operstate": "UP",
                       "addr_info": [{"family": "inet", "local": "10.214.0.11"}]}])


def test_interface_and_route_facts_from_ip_json() -> None:
    i = parse_interface(IP_ADDR, "fab0", "10.214.0.11")
    assert i == Interface("fab0", "10.214.0.11", ("10.214.0.11",), 9000, True)
    assert parse_interface(IP_ADDR, "fab0", "10.214.0.99") == Interface(
        "fab0", None, ("10.214.0.11",), 9000, True)
    assert parse_interface("[]", "fab0", "10.214.0.11") is None
    r = parse_route(json.dumps([{"dst": "10.214.0.12", "dev": "fab0", "prefsrc": "10.214.0.11",
                                 "flags": [], "uid": 0, "cache": []}]))
    assert r == Route("fab0", "10.214.0.11", None)
    with pytest.raises(ValueError):
        parse_route("[]")


def _link(**changes: Any) -> LinkRecord:
    fields: dict[str, Any] = dict(
        edge="node-1->node-2", source="node-1", destination="node-2",
        source_address="10.0.0.1", destination_address="10.0.0.2",
        source_interface=Interface("fab0", "10.0.0.1", ("10.0.0.1",), 9000, True),
        destination_interface=Interface("fab0", "10.0.0.2", ("10.0.0.2",), 9000, True),
        route=Route("fab0", "10.0.0.1", None), reverse_route=Route("fab0", "10.0.0.2", None),
        transport={"source": "ucx_tcp"}, tool_version="iperf 3.12",
        test_parameters={"seconds": 1}, host_keys={"node-1": "SHA256:a", "node-2": "SHA256:b"})
    fields.update(changes)
    return LinkRecord(**fields)


def test_the_fingerprint_moves_with_every_fact_a_sample_depends_on() -> None:
    base = _link().fingerprint
    for change in ({"destination_interface": Interface("fab0", "10.0.0.2", ("10.0.0.2",), 1500,
                                                       True)},
                   {"route": Route("mgmt0", "10.0.0.1", None)}, {"tool_version": "iperf 3.16"},
                   {"host_keys": {"node-1": "SHA256:a", "node-2": "SHA256:c"}},
                   {"test_parameters": {"seconds": 2}}):
        assert _link(**change).fingerprint != base, change
    assert _link().fingerprint == base


def _sample(gbps: float, retransmits: int = 0, cpu: float = 10.0) -> iperf.IperfSample:
    return iperf.IperfSample(gbps, 1.0, int(gbps * 1e9 / 8), retransmits, 8948, cpu, 10.0, "3")


@pytest.mark.parametrize(("link", "outcome", "cause"), [
    (_link(route=Route("mgmt0", "192.168.0.1", None)), dx.Outcome(), "route"),
    (_link(destination_interface=Interface("fab0", "10.0.0.2", ("10.0.0.2",), 1500, True)),
     dx.Outcome(sample=_sample(0.001)), "mtu"),
    (_link(), dx.Outcome(error=iperf.IperfError("refused", "Connection refused"), listening=True),
     "firewall"),
    (_link(), dx.Outcome(error=iperf.IperfError("refused", "Connection refused")), "listener"),
    (_link(), dx.Outcome(error=iperf.IperfError("timed_out", "timed out"), listening=True),
     "firewall"),
    (_link(), dx.Outcome(port_owner='(("sshd",pid=9,fd=3))'), "listener"),
    (_link(), dx.Outcome(sample=_sample(0.5, retransmits=5000)), "retransmissions"),
    (_link(), dx.Outcome(sample=_sample(0.5, cpu=99.0)), "cpu"),
    (_link(), dx.Outcome(sample=_sample(0.5), traffic=["engine-1: rose"]), "traffic"),
    (_link(), dx.Outcome(sample=_sample(0.009)), "capacity"),
])
def test_each_cause_is_read_from_a_measured_fact(link: LinkRecord, outcome: dx.Outcome,
                                                 cause: str) -> None:
    found = dx.diagnose(link, outcome, 1.0, 5201)
    assert cause in [c.cause for c in found], found
    assert all(c.fix for c in found)


def test_capacity_is_named_only_when_nothing_else_explains_the_miss() -> None:
    found = dx.diagnose(_link(), dx.Outcome(sample=_sample(0.5, retransmits=5000)), 1.0, 5201)
    assert [c.cause for c in found] == ["retransmissions"]


def _proof(running: float = 0, prompt: float = 100) -> dict[str, Any]:
    return {"idle": running == 0, "busy": {"vllm:num_requests_running": running} if running
            else {}, "gauges": {"vllm:num_requests_running": running},
            "counters": {"vllm:prompt_tokens_total": prompt}}


def test_traffic_that_came_and_went_during_a_sample_still_shows_in_the_counters() -> None:
    assert Fabric.traffic({"e1": _proof()}, {"e1": _proof()}) == []
    [came] = Fabric.traffic({"e1": _proof(), "e2": _proof()},
                            {"e1": _proof(prompt=164), "e2": _proof()})
    assert came.startswith("e1: vllm:prompt_tokens_total rose by 64")
    [busy] = Fabric.traffic({"e1": _proof(running=1)}, {"e1": _proof()})
    assert "before the sample" in busy


def test_the_matrix_round_trips_and_draws_a_png() -> None:
    rows = [EdgeRow("a->b", "a", "b", 0.02, 9.1, "pass", "sha256:1", "001", False,
                    "edge-a-to-b.json", None),
            EdgeRow("b->a", "b", "a", 0.02, 0.01, "fail", "sha256:2", "001", False,
                    "edge-b-to-a.json", "edge-b-to-a.diagnosis.json", ("capacity",))]
    assert [row_from(r.document()) for r in rows] == rows
    assert rows[0].margin == pytest.approx(455.0)
    assert heatmap_png(rows, ["a", "b"])[:8] == b"\x89PNG\r\n\x1a\n"


PERFTEST = Path(__file__).resolve().parents[2] / "fixtures" / "perftest"


def test_perftests_bw_average_is_read_from_its_report_not_typed() -> None:
    from narwhal.deploy.fabric import perftest

    s = perftest.parse((PERFTEST / "ib_write_bw-client-roce.txt").read_text(), "", 0)
    assert s == perftest.PerftestSample(98.27, 1048576, 112500, "mlx5_0", "Ethernet", "3")
    mb = perftest.parse(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   "
                        "MsgRate[Mpps]\n 65536      5000             1192.09            "
                        "1192.09\t\t   0.019073\n", "", 0)
    assert isinstance(mb, perftest.PerftestSample)
    assert mb.gbps == pytest.approx(1192.09 * 1048576 * 8 / 1e9)


@pytest.mark.parametrize(("stdout", "stderr", "status", "kind"), [
    ("", " Did not detect devices \n If device exists, check if driver is up\n", 1,
     "no_device"),
    ("", " Couldn't connect to 10.0.0.2:18515\nConnection refused", 1, "refused"),
    ("", " Couldn't connect to 10.0.0.2:18515\nUnable to open file descriptor", 1, "timed_out"),
    ("garbage", "segfault", 139, "other"),
])
def test_perftest_failures_are_classified(stdout: str, stderr: str, status: int,
                                          kind: str) -> None:
    from narwhal.deploy.fabric import perftest

    got = perftest.parse(stdout, stderr, status)
    assert isinstance(got, iperf.IperfError) and got.kind == kind


def test_the_rdma_tool_binds_both_ends_and_names_each_hca() -> None:
    from narwhal.deploy.fabric.tools import Rdma, Tool

    t = Tool("ib_write_bw", 10, 1, 1, 18515, Rdma("mlx5_1", 1), Rdma.parse("mlx5_0:2"))
    assert t.server("10.0.0.2")[:5] == ["ib_write_bw", "-d", "mlx5_1", "-i", "1"]
    assert t.server("10.0.0.2")[-2:] == ["--bind_source_ip", "10.0.0.2"]
    client = t.client("10.0.0.1", "10.0.0.2")
    assert client[1:5] == ["-d", "mlx5_0", "-i", "2"] and client[-3:] == [
        "--bind_source_ip", "10.0.0.1", "10.0.0.2"]
    assert t.parameters()["source_hca"] == "mlx5_0:2"
    assert Rdma.parse("") is None and Rdma.parse("rxe0") == Rdma("rxe0", 1)


def test_the_roce_v2_gid_of_the_fabric_address_is_picked_from_gate_as_facts() -> None:
    from narwhal.deploy.fabric.tools import Rdma

    facts = [{"device": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE",
                                             "link_layer": "Ethernet", "gids": [
        {"index": 0, "gid": "fe80::1", "type": "IB/RoCE v1"},
        {"index": 1, "gid": "fe80::1", "type": "RoCE v2"},
        {"index": 2, "gid": "::ffff:10.0.0.1", "type": "IB/RoCE v1"},
        {"index": 3, "gid": "::ffff:10.0.0.1", "type": "RoCE v2"}]}]}]
    hca = Rdma("mlx5_0", 1).with_gid(facts, "10.0.0.1")
    assert hca.gid_index == 3
    assert Rdma("mlx5_0", 1).with_gid(facts, "10.0.0.9").gid_index is None  # not on this port
    assert Rdma("mlx5_1", 1).with_gid(facts, "10.0.0.1").gid_index is None
    from narwhal.deploy.fabric.tools import Tool

    t = Tool("ib_write_bw", 10, 0, 1, 18515, hca, hca)
    assert t.server("10.0.0.1")[5:7] == ["-x", "3"]
