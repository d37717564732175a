"""Gate E on the lab: `narwhal attest` after Gates C and D, from the workstation namespace.

Each engine's sidecar is started on its host by the product and checked from the router host;
the tests read the sidecars from the router host too (its role shell), as the router will.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from tests.lab.installing import Installer

from narwhal.core import result_line
from narwhal.core.fleet import FleetDocument
from narwhal.lab.plan import LabPlan
from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]


def _clear_containers(plan: LabPlan) -> None:
    for h in plan.engines():
        ssh(plan, h.name, "docker ps -aq | xargs -r docker rm -f >/dev/null")


def _stop_sidecars(installer: Installer) -> None:
    """End the sidecars the attest attempts started (by pid and start time, as owned), so the
    next module finds the attest ports free. In a deployment they keep running."""
    for owned in (installer.op.runs / "lab" / "attest").glob("*/owned.jsonl"):
        for line in owned.read_text().splitlines():
            row = json.loads(line)
            if row["kind"] != "process":
                continue
            pid, ticks = int(row["pid"]), int(row["start_ticks"])
            ssh(installer.op.plan, installer.lab_host(row["host"]),
                f"s=$(cat /proc/{pid}/stat 2>/dev/null) && t=$(echo \"${{s##*) }}\" | cut -d' ' "
                f"-f20) && [ \"$t\" = {ticks} ] && kill {pid}; true")


@pytest.fixture(scope="module")
def attested(installer: Installer) -> Iterator[Installer]:
    done = installer.install()
    assert done.returncode == 0, done.stdout + done.stderr
    _clear_containers(installer.op.plan)
    try:
        for gate, extra in (("engines", ()), ("fabric", ("--seconds", "1", "--omit", "0"))):
            code, doc = installer.op.json_command(gate, *extra)
            assert code == 0 and doc["verdict"] == "passed", doc
        yield installer
    finally:
        _stop_sidecars(installer)
        _clear_containers(installer.op.plan)


def _from_router(fleet: Installer, url: str) -> dict[str, Any]:
    done = fleet.op.shell("router", "narwhal-attest", "fetch", "--url", url)
    got = result_line.parse(done.stdout, "narwhal-attest fetch")
    assert got.ok, (got.error, done.stderr[-2000:])
    return dict(got.data)


def _live_start(plan: LabPlan, host: str, port: int) -> float:
    text = ssh(plan, host, f"python3 -c \"import urllib.request; print(urllib.request."
                           f"urlopen('http://127.0.0.1:{port}/metrics').read().decode())\"").stdout
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
        live = _live_start(attested.op.plan, f"eng{n}", record["ports"]["engine"])
        assert a["process"]["process_start_time_seconds"] == live == \
            cap["process_start_time_seconds"]
        assert a["digest"] == entry.contract.attestation_digest
    before = json.loads((attempt / "fleet-before.json").read_text())
    assert all("attestation_url" not in e for e in before["engines"])  # the draft, kept


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


def test_the_sidecars_are_stopped_by_their_owner_record(attested: Installer) -> None:
    """What the module's cleanup does, checked: no attest port is held afterwards."""
    _stop_sidecars(attested)
    for n in (1, 2, 3):
        port = json.loads((attested.op.last_attempt("discover") / f"launch-engine-{n}.json")
                          .read_text())["ports"]["attest"]
        held = ssh(attested.op.plan, f"eng{n}", f"ss -Hltn 'sport = :{port}'").stdout
        assert not held.strip(), held
