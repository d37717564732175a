"""Gate E on the lab: `narwhal attest` after Gates C and D, from the workstation namespace.

Each engine's sidecar is started on its host by the product and checked from the router host;
the tests read the sidecars from the router host too (its role shell), as the router will.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.lab.fleet_up import stop_sidecars, through
from tests.lab.installing import Installer

from narwhal.core import result_line
from narwhal.core.fleet import FleetDocument
from narwhal.lab.faults import Faults
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def attested(installer: Installer) -> Iterator[Installer]:
    with through(installer, "engines", "fabric") as fleet:
        yield fleet


def _from_router(fleet: Installer, url: str) -> dict[str, Any]:
    done = fleet.op.shell("router", "narwhal-attest", "fetch", "--url", url)
    got = result_line.parse(done.stdout, "narwhal-attest fetch")
    assert got.ok, (got.error, done.stderr[-2000:])
    return dict(got.data)


def _live_start(plan: LabPlan, host: str, port: int, address: str) -> float:
    """The engine's process start time from its /metrics, at the address it binds."""
    text = ssh(plan, host, f"python3 -c \"import urllib.request; print(urllib.request."
                           f"urlopen('http://{address}:{port}/metrics').read().decode())\"").stdout
    [value] = re.findall(r"^process_start_time_seconds (\S+)$", text, re.M)
    return float(value)


def test_every_sidecar_attests_the_captured_live_engine_as_the_router_host_sees_it(
        attested: Installer) -> None:
    code, doc = attested.op.json_command("attest")
    assert code == 0 and doc["verdict"] == "passed", doc
    assert doc["router_host"] == "router"
    attempt = attested.op.last_attempt("attest")
    engines = attested.op.last_attempt("engines")
    discover = attested.op.last_attempt("discover")
    fleet = FleetDocument.model_validate_json((attempt / "fleet.json").read_text())
    for n in (1, 2, 3):
        role = f"engine-{n}"
        cap = json.loads((engines / f"cache-layout-{role}.json").read_text())
        record = json.loads((discover / f"launch-{role}.json").read_text())
        [entry] = [e for e in fleet.engines if e.id == role]
        assert entry.attestation_url is not None and entry.contract is not None
        got = _from_router(attested, entry.attestation_url)
        assert got["status"] == 200, got
        a = got["document"]
        assert a["compatibility_hash"] == cap["ranks"][0]["compatibility_hash"] == \
            entry.contract.compatibility_hash
        live = _live_start(attested.op.plan, f"eng{n}", record["ports"]["engine"],
                           record["fabric_address"])
        assert a["process"]["process_start_time_seconds"] == live == \
            cap["process_start_time_seconds"]
        assert a["digest"] == entry.contract.attestation_digest
    before = json.loads((attempt / "fleet-before.json").read_text())
    assert all("attestation_url" not in e for e in before["engines"])  # the draft, kept


def _placed(fleet: Installer, doc: dict[str, Any], *, tenants: bool = True) -> dict[str, Any]:
    """Gate E's fleet for a router the test starts outside Gate G's folder: the key files it
    names (../secrets/...) made absolute, as Gate B placed them on every host. `tenants`
    False drops the client key, for a host Gate B gave no router key (an engine host)."""
    secrets_dir = fleet.secrets_dir()

    def absolute(path: str) -> str:
        return f"{secrets_dir}/{path.removeprefix('../secrets/')}"
    out = json.loads(json.dumps(doc))
    if "engine_auth" in out:
        out["engine_auth"]["key_file"] = absolute(out["engine_auth"]["key_file"])
    out["tenants"] = [{**t, "key_file": absolute(t["key_file"])}
                      for t in out.get("tenants", []) if "key_file" in t] if tenants else []
    return out


def _contract_from_router(fleet: Installer, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """narwhal-check's contract gate on the router host against `doc` and Gate C's captures
    (what Gate F will hand it; until then the test copies them through the role shell).
    Returns the contract verdicts by subject."""
    op = fleet.op
    files = {"fleet.json": json.dumps(_placed(fleet, doc)).encode()}
    for e in doc["engines"]:
        files[f"captures/launch-{e['id']}.json"] = (
            op.last_attempt("discover") / f"launch-{e['id']}.json").read_bytes()
        files[f"captures/cache-layout-{e['id']}.json"] = (
            op.last_attempt("engines") / f"cache-layout-{e['id']}.json").read_bytes()
    writes = " && ".join(f"printf %s {base64.b64encode(data).decode()} | base64 -d > {name}"
                         for name, data in files.items())
    done = op.shell("router", "sh", "-c", "rm -rf ~/check-test && mkdir -p ~/check-test/"
                    f"captures && cd ~/check-test && {writes} && narwhal-check --fleet "
                    "fleet.json --captures captures --only contract --json")
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    return {v["subject"]: v for v in json.loads(done.stdout)["verdicts"]
            if v["gate"] == "contract"}


def test_narwhal_check_contract_gate_passes_against_the_finalised_fleet(
        attested: Installer) -> None:
    code, doc = attested.op.json_command("attest")
    assert code == 0 and doc["verdict"] == "passed", doc
    fleet = json.loads((attested.op.last_attempt("attest") / "fleet.json").read_text())
    verdicts = _contract_from_router(attested, fleet)
    engines = [e["id"] for e in fleet["engines"]]
    pairs = [f"{a}->{b}" for a in engines for b in engines if a != b]
    assert set(verdicts) >= {*engines, *pairs}, sorted(verdicts)
    assert {k: v["status"] for k, v in verdicts.items()} == {k: "pass" for k in verdicts}


def test_a_replaced_engine_is_refused_by_its_sidecar_with_the_reason(
        attested: Installer) -> None:
    code, doc = attested.op.json_command("attest")
    assert code == 0, doc
    fleet = json.loads((attested.op.last_attempt("attest") / "fleet.json").read_text())
    url = next(e["attestation_url"] for e in fleet["engines"] if e["id"] == "engine-2")
    run_dir = f"{attested.op.plan.spec.run_dir}/engine-2"
    for sub in ("stop", "start"):  # the same checked plan, a new container
        done = attested.op.shell("engine-2", "narwhal-engine", sub, "--run-dir", run_dir)
        assert result_line.parse(done.stdout, f"narwhal-engine {sub}").ok, done.stdout
    got = _from_router(attested, url)
    assert got["status"] == 503, got
    assert "engine process changed" in got["document"]["error"]
    other = next(e["attestation_url"] for e in fleet["engines"] if e["id"] == "engine-1")
    assert _from_router(attested, other)["status"] == 200  # the others still attest


ROUTER_PORT = 8391


def _router_get(plan: LabPlan, path: str, host: str = "router", port: int = ROUTER_PORT
                ) -> Any:
    """A router's JSON answer from its own host; None while it does not answer."""
    text = ssh(plan, host, f"python3 -c \"import urllib.request; print(urllib.request."
                           f"urlopen('http://127.0.0.1:{port}{path}', timeout=5)"
                           ".read().decode())\"").stdout
    try:
        return json.loads(text)
    except ValueError:
        return None


def _router_get_at(plan: LabPlan, role_host: str, port: int) -> Any:
    host = "router" if role_host == "router" else "eng1"
    return _router_get(plan, "/narwhal/state", host, port)


def _holds(plan: LabPlan) -> dict[str, str | None] | None:
    state = _router_get(plan, "/narwhal/state")
    return None if state is None else {e["id"]: e["held_reason"] for e in state["engines"]}


def _complete(plan: LabPlan, model: str, secrets_dir: str) -> int:
    """One completion through the test's router, with the tenant key read on the host from
    the file Gate B placed (never in an argv)."""
    body = json.dumps({"model": model, "prompt": "the sea", "max_tokens": 2}).replace('"', '\\"')
    code = ("import urllib.request, urllib.error\n"
            f"k = open('{secrets_dir}/NARWHAL_ROUTER_API_KEY').read().strip()\n"
            f"r = urllib.request.Request('http://127.0.0.1:{ROUTER_PORT}/v1/completions', "
            f"data=b'{body}', headers={{'Content-Type': 'application/json', "
            "'Authorization': 'Bearer ' + k})\n"
            "try:\n    print(urllib.request.urlopen(r, timeout=30).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    done = ssh(plan, "router", f"python3 -c \"{code}\"", timeout=60)
    return int(done.stdout.strip() or 0)


def _start_router(fleet: Installer, doc: dict[str, Any]) -> int:
    """narwhal-serve on the router host with Gate E's fleet, from the role shell (what Gate G
    will do; until it exists the test starts it so). Returns its pid."""
    raw = base64.b64encode(json.dumps(_placed(fleet, doc)).encode()).decode()
    done = fleet.op.shell("router", "sh", "-c",
                          f"mkdir -p ~/restart-test && cd ~/restart-test && printf %s {raw} | "
                          "base64 -d > fleet.json && setsid narwhal-serve --fleet fleet.json "
                          f"--host 127.0.0.1 --port {ROUTER_PORT} >router.log 2>&1 </dev/null "
                          "& echo $!")
    return int(done.stdout.strip())


def _wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


def _status(fleet: Installer) -> dict[str, Any]:
    code, doc = fleet.op.json_command("status")
    assert code == 0, doc
    return doc


def _gate_states(doc: dict[str, Any]) -> dict[str, str]:
    return {g["gate"]: g["state"] for g in doc["gates"]}


def _sidecar_pids(fleet: Installer) -> dict[str, int]:
    """Every sidecar process the attest attempts started that is alive now, by engine."""
    out = {}
    for owned in (fleet.op.runs / "lab" / "attest").glob("*/owned.jsonl"):
        for line in owned.read_text().splitlines():
            row = json.loads(line)
            host = fleet.lab_host(row["host"])
            alive = ssh(fleet.op.plan, host, f"cut -d' ' -f22 /proc/{row['pid']}/stat "
                                             "2>/dev/null").stdout.strip()
            if alive == str(row["start_ticks"]):
                out[row["serves"]] = int(row["pid"])
    return out


def test_a_restarted_engine_is_held_named_by_status_and_attested_again_alone(
        attested: Installer) -> None:
    """The runbook's repeat row "engine restart with the same launch plan", end to end: the
    router holds the restarted engine out while serving on the others, `narwhal status`
    names it with the work to repeat, and the repeat touches that engine alone."""
    op, plan = attested.op, attested.op.plan
    # Whatever the earlier tests left: capture engine-2 again, attest (the others are kept).
    code, doc = op.json_command("engines", "--recapture", "engine-2")
    assert code == 0 and doc["verdict"] == "passed", doc
    code, doc = op.json_command("attest")
    assert code == 0 and doc["verdict"] == "passed", doc
    assert _status(attested)["engines_changed"] == []
    contract_before = (op.last_attempt("engines") / "contract.json").read_bytes()
    fleet = json.loads((op.last_attempt("attest") / "fleet.json").read_text())
    pids_before = _sidecar_pids(attested)
    assert sorted(pids_before) == ["engine-1", "engine-2", "engine-3"]

    router = _start_router(attested, fleet)
    try:
        try:
            _wait("the router to place on every engine", lambda: _holds(plan) == {
                "engine-1": None, "engine-2": None, "engine-3": None}, timeout=30)
        except AssertionError:
            log = op.shell("router", "sh", "-c", "cat ~/restart-test/router.log").stdout
            raise AssertionError(f"{_holds(plan)}; router log: {log[-3000:]}") from None
        assert _complete(plan, fleet["model"], attested.secrets_dir()) == 200

        ssh(plan, "eng2", "docker restart -t 5 $(docker ps -q)", timeout=60)
        sweep = float(fleet.get("health", {}).get("probe_interval_s", 2.0))
        _wait("the hold of engine-2", lambda: (_holds(plan) or {}).get("engine-2")
              == "attestation", timeout=2 * sweep + 3)
        held = next(e for e in _router_get(plan, "/narwhal/state")["engines"]
                    if e["id"] == "engine-2")
        assert "engine process changed" in held["held_detail"]
        assert [_complete(plan, fleet["model"], attested.secrets_dir())
                for _ in range(4)] == [200] * 4  # the others
        contract = _contract_from_router(attested, fleet)
        assert {k for k, v in contract.items() if v["status"] == "fail"} == {"engine-2"}, \
            contract
        assert "capture it again" in json.dumps(contract["engine-2"])

        status = _status(attested)
        [change] = status["engines_changed"]
        assert change["engine"] == "engine-2" and change["recapture"] is True
        assert "engine process changed" in change["reason"]
        assert [s.split(":")[0] for s in change["repeat"]] == [
            "capture", "attestation", "profile of engine-2", "full preflight", "fabric"]
        states = _gate_states(status)
        assert states["engines"] == states["attest"] == "stale"
        assert states["fabric"] == "passed"  # the geometry has not been shown to move

        code, doc = op.json_command("engines", "--recapture", "engine-2")
        assert code == 0 and doc["verdict"] == "passed", doc
        assert (op.last_attempt("engines") / "contract.json").read_bytes() == contract_before
        assert _gate_states(_status(attested))["fabric"] == "passed"

        code, doc = op.json_command("attest")
        assert code == 0 and doc["verdict"] == "passed", doc
        summary = json.loads((op.last_attempt("attest") / "engine-attestation.json").read_text())
        assert {k: v["sidecar"] for k, v in summary["engines"].items()} == {
            "engine-1": "kept", "engine-2": "started", "engine-3": "kept"}
        after = json.loads((op.last_attempt("attest") / "fleet.json").read_text())
        digests = {e["id"]: e["contract"]["attestation_digest"] for e in fleet["engines"]}
        again = {e["id"]: e["contract"]["attestation_digest"] for e in after["engines"]}
        assert [k for k in digests if digests[k] != again[k]] == ["engine-2"]
        pids_after = _sidecar_pids(attested)
        assert pids_after["engine-1"] == pids_before["engine-1"]
        assert pids_after["engine-3"] == pids_before["engine-3"]
        assert pids_after["engine-2"] != pids_before["engine-2"]
        assert "engine-2" in pids_after and len(pids_after) == 3  # the old one is gone

        status = _status(attested)
        assert status["engines_changed"] == []
        assert _gate_states(status)["attest"] == "passed"
    finally:
        op.shell("router", "kill", str(router))


LEASE_PORT = 8392
POLLER = Path(__file__).with_name("ready_poller.py")


def _serve_detached(fleet: Installer, role: str, doc: dict[str, Any], *extra: str) -> int:
    """narwhal-serve on the host of `role` from its role shell, listening on every address
    (without the client key: an engine host holds none, and /ready needs none)."""
    raw = base64.b64encode(json.dumps(_placed(fleet, doc, tenants=False)).encode()).decode()
    done = fleet.op.shell(role, "sh", "-c",
                          f"mkdir -p ~/lease-test && cd ~/lease-test && printf %s {raw} | "
                          "base64 -d > fleet.json && setsid narwhal-serve --fleet fleet.json "
                          f"--host 0.0.0.0 --port {LEASE_PORT} {' '.join(extra)} "
                          ">router.log 2>&1 </dev/null & echo $!")
    return int(done.stdout.strip())


def _poll(netns: str, seconds: float, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-I", str(POLLER),
                             str(seconds), url], stdout=subprocess.PIPE, text=True)


def _answers(poller: subprocess.Popen[str]) -> list[tuple[float, bool]]:
    out, _ = poller.communicate(timeout=120)
    return [(row["t"], row["ok"]) for row in map(json.loads, out.splitlines())]


def test_one_router_serves_through_the_sidecars_quorum_and_a_cut_primary_yields(
        attested: Installer, faults: Faults) -> None:
    """Routers on two lab hosts hold the controller lease through the sidecars' majority: the
    primary serves alone; cut from every network it stops within the lease period, the
    standby takes over within 2 s of that, and the old primary never serves again."""
    op, plan = attested.op, attested.op.plan
    code, doc = op.json_command("attest")
    assert code == 0 and doc["verdict"] == "passed", doc
    fleet = json.loads((op.last_attempt("attest") / "fleet.json").read_text())
    quorum = fleet["controller"]["quorum"]
    assert len(quorum["lease_urls"]) == 3 and quorum["deployment"] == "lab"
    ttl = float(fleet["controller"].get("lease_ttl_s", 1.0))
    router_host = plan.host(attested.lab_host("router"))
    standby_host = plan.host(attested.lab_host("engine-1"))
    primary_url = f"http://{router_host.mgmt_ip}:{LEASE_PORT}"
    standby_url = f"http://{standby_host.mgmt_ip}:{LEASE_PORT}"
    primary = _serve_detached(attested, "router", fleet)
    standby = 0
    try:
        _wait("the primary", lambda: _router_get_at(plan, "router", LEASE_PORT) is not None,
              timeout=30)
        raw = base64.b64encode(json.dumps(_placed(attested, fleet, tenants=False)).encode())
        second = op.shell("engine-1", "sh", "-c", f"cd ~/lease-test 2>/dev/null || mkdir -p "
                          f"~/lease-test; printf %s {raw.decode()} "
                          f"| base64 -d > ~/lease-test/fleet.json; cd ~/lease-test && timeout 20 "
                          f"narwhal-serve --fleet fleet.json --host 0.0.0.0 --port {LEASE_PORT + 1}")
        said = second.stdout + second.stderr
        assert second.returncode == 1, said
        assert "holds the lease" in said and "pid" in said, said  # the holder is named
        standby = _serve_detached(attested, "engine-1", fleet, "--standby-of", primary_url)
        run_s, cut_after = 20.0, 8.0
        client = [_poll(plan.ws_netns, run_s, f"{u}/ready") for u in (primary_url, standby_url)]
        inside = _poll(router_host.netns, run_s, f"http://127.0.0.1:{LEASE_PORT}/ready")
        time.sleep(cut_after)
        cut_at = time.monotonic()
        cut = faults.isolate(router_host.name)
        seen_primary, seen_standby = (_answers(c) for c in client)
        seen_inside = _answers(inside)
        faults.clear(cut["id"])
        serving_p = [t for t, ok in seen_primary + seen_inside if ok]
        serving_s = [t for t, ok in seen_standby if ok]
        assert serving_p and serving_s, (seen_primary[-3:], seen_standby[-3:])
        assert max(serving_p) < min(serving_s)  # never both at any instant
        last_primary = max(t for t, ok in seen_inside if ok)
        assert last_primary - cut_at <= ttl + 0.2, (last_primary - cut_at, ttl)
        assert min(serving_s) - last_primary <= 2.0, min(serving_s) - last_primary
        assert all(ok for t, ok in seen_standby if t > min(serving_s) + 0.5)  # it goes on
        print(f"cut -> primary's last /ready 200: {last_primary - cut_at:.3f} s (ttl {ttl} s); "
              f"-> standby's first: {min(serving_s) - last_primary:.3f} s")

        reconnected = _poll(plan.ws_netns, 3.0, f"{primary_url}/ready")
        assert not any(ok for _, ok in _answers(reconnected))  # no serving without an epoch
        state = _router_get_at(plan, "engine-1", LEASE_PORT)
        assert state is not None and state["controller"]["role"] == "primary"
    finally:
        op.shell("router", "kill", str(primary))
        if standby:
            op.shell("engine-1", "kill", str(standby))


def test_status_says_so_when_the_router_host_cannot_be_asked(attested: Installer,
                                                             faults: Faults) -> None:
    """The live check is extra: with the router host cut off, `narwhal status` still shows the
    record and says why it did not ask the sidecars; `--offline` never asks."""
    cut = faults.isolate(attested.lab_host("router"))
    try:
        started = time.monotonic()
        doc = _status(attested)
        assert doc["live_check"].startswith("live check skipped") and "router" in \
            doc["live_check"], doc["live_check"]
        assert doc["engines_changed"] == [] and time.monotonic() - started < 60
        code, offline = attested.op.json_command("status", "--offline")
        assert code == 0 and offline["live_check"] == "off"
    finally:
        faults.clear(cut["id"])


def test_the_sidecars_are_stopped_by_their_owner_record(attested: Installer) -> None:
    """What the module's cleanup does, checked: no attest port is held afterwards."""
    stop_sidecars(attested)
    for n in (1, 2, 3):
        port = json.loads((attested.op.last_attempt("discover") / f"launch-engine-{n}.json")
                          .read_text())["ports"]["attest"]
        held = ssh(attested.op.plan, f"eng{n}", f"ss -Hltn 'sport = :{port}'").stdout
        assert not held.strip(), held
