"""Gate D on the lab: `narwhal fabric` from the workstation namespace, as an operator runs it.

The engines come up through Gate C once for the module; every test then proves the fabric
between the three engine hosts, one directed edge at a time, with the lab's real iperf3 on
both ends driven over SSH, and a lab fault (shaping, a firewall, loss, an MTU, engine load)
where the test needs one. Every fault is undone when its test ends.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.lab.installing import Installer, rows

from narwhal.lab.faults import Faults
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]
EDGES = {f"node-{a}->node-{b}" for a in (1, 2, 3) for b in (1, 2, 3) if a != b}
FAST = ("--seconds", "1", "--omit", "0")


def _clear_containers(plan: LabPlan) -> None:
    for h in plan.engines():
        ssh(plan, h.name, "docker ps -aq | xargs -r docker rm -f >/dev/null")


@pytest.fixture(scope="module")
def fleet(installer: Installer) -> Iterator[Installer]:
    done = installer.install()
    assert done.returncode == 0, done.stdout + done.stderr
    _clear_containers(installer.op.plan)
    code, doc = installer.op.json_command("engines")
    assert code == 0 and doc["verdict"] == "passed", doc
    try:
        yield installer
    finally:
        _clear_containers(installer.op.plan)


def _fabric(fleet: Installer, *args: str, env: Path | None = None) -> tuple[int, dict[str, Any]]:
    return fleet.op.json_command("fabric", *FAST, *args, env=env)


def _edges(attempt: Path) -> dict[str, dict[str, Any]]:
    return {e["edge"]: e for e in json.loads((attempt / "edges.json").read_text())["edges"]}


def _clients(attempt: Path) -> list[dict[str, Any]]:
    return [r for r in rows(attempt) if r["argv"][:2] == ["iperf3", "--client"]]


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _measured(attempt: Path) -> set[str]:
    return {name for name, e in _edges(attempt).items() if not e["reused"]}


def test_every_directed_edge_passes_one_at_a_time_with_its_idle_proof(fleet: Installer) -> None:
    code, doc = _fabric(fleet, "--resample", "node-1->node-2")
    assert code == 0 and doc["verdict"] == "passed", doc
    attempt = fleet.op.last_attempt("fabric")
    edges = _edges(attempt)
    assert set(edges) == EDGES and {e["verdict"] for e in edges.values()} == {"pass"}
    clients = sorted(_clients(attempt), key=lambda r: r["start"])
    assert clients, "no edge was measured"
    for a, b in itertools.pairwise(clients):  # strictly one edge at a time
        assert _t(a["end"]) <= _t(b["start"]), (a, b)
    for name in _measured(attempt):
        sample = json.loads((attempt / edges[name]["sample"]).read_text())
        for when in ("before", "after"):
            proof = sample["idle_proof"][when]
            assert set(proof) == {"engine-1", "engine-2", "engine-3"}
            assert all(p["idle"] and "vllm:num_requests_running" in p["gauges"]
                       for p in proof.values())
        assert sample["client_report"]["end"]["sum_received"]["bits_per_second"] > 0
    # The budget by hand: the lab model's K and V for every layer and KV head, 2-byte
    # elements, 1024 prompt tokens in whole 128-token blocks, 1 handoff/s, headroom 1.25.
    cfg = json.loads((fleet.op.last_attempt("engines") / "cache-layout-engine-1.json")
                     .read_text())["checkpoint_config"]
    per_token = (2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * 2
                 * cfg["hidden_size"] // cfg["num_attention_heads"])
    want = 8 * per_token * 1024 * 1 * 1.25 / 1e9
    assert {round(e["required_gbps"], 9) for e in edges.values()} == {round(want, 9)}
    budget = json.loads((attempt / "budget.json").read_text())
    assert budget["groups"][0]["payload_bytes_per_handoff"] == per_token * 1024
    assert (attempt / "edge-matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_shaped_edge_fails_with_its_rate_and_diagnosis_then_only_it_is_resampled(
        fleet: Installer, faults: Faults) -> None:
    faults.shape("eng1", "eng2", "10mbit")  # a policer: nothing in the link record moves,
    # so every edge is measured on purpose here (as on a first run)
    code, doc = _fabric(fleet, *[a for e in sorted(EDGES) for a in ("--resample", e)])
    assert code != 0 and doc["verdict"] == "blocked", doc
    attempt = fleet.op.last_attempt("fabric")
    edges = _edges(attempt)
    assert _measured(attempt) == EDGES
    assert {n for n, e in edges.items() if e["verdict"] != "pass"} == {"node-1->node-2"}
    shaped = edges["node-1->node-2"]
    assert shaped["verdict"] == "fail" and not shaped["reused"]
    assert shaped["measured_gbps"] <= 0.011 < shaped["required_gbps"]
    diagnosis = json.loads((attempt / shaped["diagnosis"]).read_text())
    assert diagnosis["causes"], diagnosis
    assert edges["node-2->node-1"]["verdict"] == "pass"
    assert [p["field"] for p in doc["problems"]] == ["node-1->node-2"]
    faults.clear()
    code, doc = _fabric(fleet)
    assert code == 0, doc
    again = fleet.op.last_attempt("fabric")
    assert _measured(again) == {"node-1->node-2"}  # the other five reused by fingerprint
    assert [r["host"] for r in _clients(again)] == ["node-1"]


def test_an_mtu_changed_on_one_end_resamples_exactly_that_hosts_edges(
        fleet: Installer, faults: Faults) -> None:
    _fabric(fleet)
    faults.mtu("eng2", 1500)
    _code, doc = _fabric(fleet)
    attempt = fleet.op.last_attempt("fabric")
    assert _measured(attempt) == {e for e in EDGES if "node-2" in e}, doc
    links = json.loads((attempt / "links.json").read_text())
    assert links["node-1->node-2"]["destination_interface"]["mtu"] == 1500
    assert links["node-1->node-2"]["source_interface"]["mtu"] == 9000


def test_a_rejecting_firewall_on_the_consumer_is_diagnosed_and_passes_nothing(
        fleet: Installer, faults: Faults) -> None:
    faults.block("eng3", 5201)
    code, doc = _fabric(fleet, "--resample", "node-1->node-3", "--resample", "node-2->node-3")
    assert code != 0 and doc["verdict"] == "blocked", doc
    attempt = fleet.op.last_attempt("fabric")
    for name in ("node-1->node-3", "node-2->node-3"):
        e = _edges(attempt)[name]
        assert e["verdict"] == "fail" and e["measured_gbps"] is None, e
        assert "firewall" in e["causes"], e
        diagnosis = json.loads((attempt / e["diagnosis"]).read_text())
        assert "refused the connection while the test server listened" in \
            diagnosis["causes"][0]["found"]


def test_packet_loss_shows_as_retransmissions_in_the_diagnosis(
        fleet: Installer, faults: Faults) -> None:
    faults.loss("eng2", "eng3", 20)
    # A workload that needs 2.1 Gbit/s per edge: the clean veth edges carry several times
    # that (whether each does on 2 busy cores is not what this test is about), the lossy one
    # far less.
    env = fleet.op.variant("heavy", NARWHAL_WORKLOAD_HANDOFFS_PER_S="100")
    # The lossy link's facts did not move, so the operator measures it on purpose.
    _code, _doc = _fabric(fleet, "--resample", "node-2->node-3", env=env)
    attempt = fleet.op.last_attempt("fabric")
    e = _edges(attempt)["node-2->node-3"]
    assert e["required_gbps"] == pytest.approx(100 * 0.02097152)
    sample = json.loads((attempt / e["sample"]).read_text())["client_report"]
    assert sample["end"]["sum_sent"]["retransmits"] > 0, sample["end"]["sum_sent"]
    assert e["verdict"] == "fail" and "retransmissions" in e["causes"], e
    diagnosis = json.loads((attempt / e["diagnosis"]).read_text())
    [lost] = [c for c in diagnosis["causes"] if c["cause"] == "retransmissions"]
    assert "retransmitted" in lost["found"] and lost["fix"]


def test_load_on_an_engine_during_the_samples_voids_them(fleet: Installer) -> None:
    plan = fleet.op.plan
    record = json.loads((fleet.op.last_attempt("discover") / "launch-engine-1.json")
                        .read_text())
    port, model = record["ports"]["engine"], record["served_model_name"]
    address = record["fabric_address"]  # the engine binds the address the fleet reaches it at
    key_file = f"{fleet.secrets_dir()}/env/VLLM_API_KEY"  # the engine's own, on its host
    load = ("import json, os, time, urllib.request\n"
            f"key = open({key_file!r}).read().strip()\n"
            f"body = json.dumps({{'model': {model!r}, 'prompt': 'load ' * 64, "
            "'max_tokens': 8})\n"
            "end = time.monotonic() + 60\n"
            "for _ in range(5000):  # bounded in count and time, and stopped by a file\n"
            "    if time.monotonic() > end or os.path.exists('/tmp/load.stop'): break\n"
            f"    r = urllib.request.Request('http://{address}:{port}/v1/completions',\n"
            "        data=body.encode(), headers={'Content-Type': 'application/json',\n"
            "                                     'Authorization': 'Bearer ' + key})\n"
            "    urllib.request.urlopen(r, timeout=10).read()\n")
    assert ssh(plan, "eng1", f"rm -f /tmp/load.stop; cat > /tmp/load.py <<'PY'\n{load}PY"
               ).returncode == 0
    sent: list[subprocess.CompletedProcess[str]] = []
    sender = threading.Thread(target=lambda: sent.append(
        ssh(plan, "eng1", "python3 /tmp/load.py", timeout=90)))
    sender.start()
    try:
        time.sleep(1.0)
        code, doc = _fabric(fleet, *[a for e in sorted(EDGES) for a in ("--resample", e)])
    finally:
        ssh(plan, "eng1", "touch /tmp/load.stop")
        sender.join(timeout=90)
    assert sent and sent[0].returncode == 0, sent  # the load ran, and without an error
    assert code != 0 and doc["verdict"] == "blocked", doc
    edges = _edges(fleet.op.last_attempt("fabric"))
    assert {e["verdict"] for e in edges.values()} == {"void"}, edges
    attempt = fleet.op.last_attempt("fabric")
    diagnosis = json.loads((attempt / edges["node-2->node-3"]["diagnosis"]).read_text())
    [traffic] = [c for c in diagnosis["causes"] if c["cause"] == "traffic"]
    assert "engine-1" in traffic["found"] and "engine-2" not in traffic["found"]


def _rdma_path_proved(fleet: Installer, env: Path) -> None:
    """Gate C then Gate D on the RDMA transport: each engine is started on the HCA port
    ib_write_bw measures (its run plan's UCX environment and container devices), the links
    carry that environment, and a moved TRANSFER_DEVICES makes exactly Gates C and D stale."""
    code, doc = fleet.op.json_command("fabric", *FAST, env=env)
    assert code != 0 and "another KV path" in doc["cause"], doc  # the engines run on TCP
    _clear_containers(fleet.op.plan)  # Gate C starts them again, on the RDMA path
    code, doc = fleet.op.json_command("engines", env=env)
    assert code == 0 and doc["verdict"] == "passed", doc
    engines_plan = json.loads((fleet.op.last_attempt("engines") / "plan.json").read_text())
    for e in engines_plan["engines"]:
        assert e["transfer"]["net_devices"] == ["rxe0:1"], e
        run_plan = json.loads(ssh(fleet.op.plan, fleet.lab_host(e["host"]),
                                  f"cat {e['run_dir']}/launch.json").stdout)
        argv = run_plan["argv"]
        assert "UCX_NET_DEVICES=rxe0:1" in argv, argv
        assert any(a.startswith("UCX_TLS=rc,ud,self") for a in argv), argv
        assert "/dev/infiniband/uverbs0" in argv, argv  # the container is given the HCA
    code, doc = _fabric(fleet, env=env)
    assert code == 0 and doc["verdict"] == "passed", doc
    attempt = fleet.op.last_attempt("fabric")
    links = json.loads((attempt / "links.json").read_text())
    for link in links.values():
        assert link["test_parameters"]["tool"] == "ib_write_bw"
        for end in ("source", "destination"):
            assert link["transport"][end]["ucx"]["UCX_NET_DEVICES"] == "rxe0:1", link
    moved = fleet.op.variant("rdma-moved", NARWHAL_TRANSFER_TRANSPORT="ucx_rdma",
                             NARWHAL_TRANSFER_NET_DEVICES="rxe0:1",
                             NARWHAL_TRANSFER_DEVICES="'[\"rxe0\",\"rxe1\"]'")
    code, doc = fleet.op.json_command("status", "--offline", env=moved)
    gates = {r["gate"]: r for r in doc["gates"]}
    assert {g for g, r in gates.items() if "transport" in r.get("reason", "")} == {
        "engines", "fabric"}, doc["gates"]
    assert gates["engines"]["state"] == gates["fabric"]["state"] == "stale", doc["gates"]


def test_with_roce_on_every_host_a_shaped_edge_shows_in_ib_write_bw(
        fleet: Installer, faults: Faults) -> None:
    for host in ("eng1", "eng2", "eng3"):
        faults.rdma(host)
    env = fleet.op.variant("rdma", NARWHAL_TRANSFER_TRANSPORT="ucx_rdma",
                           NARWHAL_TRANSFER_NET_DEVICES="rxe0:1",
                           NARWHAL_TRANSFER_DEVICES="'[\"rxe0\"]'")
    _rdma_path_proved(fleet, env)
    faults.shape("eng1", "eng2", "10mbit")
    # every edge again, now with the shaped one: their fingerprints did not move
    code, doc = _fabric(fleet, *[a for e in sorted(EDGES) for a in ("--resample", e)], env=env)
    assert code != 0 and doc["verdict"] == "blocked", doc
    attempt = fleet.op.last_attempt("fabric")
    # a client names the server after its own --bind_source_ip; servers end with theirs
    clients = [r for r in rows(attempt) if r["argv"][0] == "ib_write_bw" and len(r["argv"]) > 3
               and r["argv"][-3] == "--bind_source_ip"]
    assert sorted(r["host"] for r in clients) == sorted(
        f"node-{a}" for a in (1, 2, 3) for _ in (1, 2))  # one client per edge, from its source
    edges = _edges(attempt)
    assert _measured(attempt) == EDGES
    shaped = edges["node-1->node-2"]
    assert shaped["verdict"] == "fail" and shaped["measured_gbps"] <= 0.011, shaped
    assert edges["node-2->node-1"]["verdict"] == "pass"
    report = json.loads((attempt / shaped["sample"]).read_text())["client_report"]
    assert "BW average[Gb/sec]" in report
    links = json.loads((attempt / "links.json").read_text())
    assert links["node-1->node-2"]["test_parameters"]["tool"] == "ib_write_bw"
    assert links["node-1->node-2"]["tool_version"] == "Version: 6.06"
