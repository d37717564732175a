"""Profile rows of an attested fleet name the attestation as part of the generation.

A real emulator engine started by `narwhal-engine`, its real `narwhal-attest` sidecar, and a
fleet document as Gate E writes it: narwhal-profile writes the attestation digest into the
row, narwhal-check's profile gate and the router bind the row only while the sidecar vouches,
and after a restart with the same plan narwhal-profile and narwhal-check refuse the engine
with the sidecar's reason (its generation is unknown until it is attested again).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from narwhal.core.profiles import load_profiles
from narwhal.lab.engine.testing import free_port
from tests.component.attest.sidecars import Attested
from tests.component.attest.test_router_attestation import _engine, _wait
from tests.component.preflight.check_fleet import run_check
from tests.component.serve.harness import Router
from tests.native_engine import engine

pytestmark = pytest.mark.timeout(300)
SWEEP = ["--repeats", "1", "--prefill-lengths", "64,128,256,512", "--decode-concurrency", "1,2",
         "--decode-contexts", "64,256", "--decode-tokens", "8"]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:  # noqa: S310 - loopback
            return bool(reply.status == 200)
    except OSError:
        return False


def _with_profiles(fleet: Path) -> Path:
    doc = json.loads(fleet.read_text())
    doc["profiles"] = {"path": "profiles.json"}
    fleet.write_text(json.dumps(doc))
    return fleet


def _profile(fleet: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "narwhal.serve.profile_cli", "--fleet",
                           str(fleet), "--json", *SWEEP, *extra],
                          capture_output=True, text=True, timeout=200, check=False)


def test_rows_carry_the_attestation_and_a_restart_is_refused_until_attested_again(
        attested: Attested) -> None:
    fleet = _with_profiles(attested.fleet())
    done = _profile(fleet)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    store = load_profiles(fleet.parent / "profiles.json", model="tiny", engine_ids=("e0",))
    [row] = store.profiles
    assert row.generation.attestation_digest == attested.document["digest"]
    assert row.generation.process_start_time_seconds == \
        attested.document["process"]["process_start_time_seconds"]

    assert run_check(fleet, "--only", "profile").verdicts("profile")["e0"]["status"] == "pass"
    router = Router(fleet, free_port()).start()
    try:
        state = _engine(router)
        assert state["held_reason"] is None and state["admitted"], state
        assert state["generation"]["attestation_digest"] == attested.document["digest"]
    finally:
        router.stop()

    run_dir = str(attested.run_dir)
    assert engine("stop", "--run-dir", run_dir).ok
    assert engine("start", "--run-dir", run_dir).ok  # the same plan, a new process
    _wait("the new engine", lambda: _answers(attested.engine_url + "/health"), timeout=60)
    again = _profile(fleet, "--overwrite")
    assert again.returncode == 1
    [outcome] = json.loads(again.stdout)["engines"]
    assert not outcome["ok"] and "engine process changed" in outcome["error"], outcome
    run = run_check(fleet, "--only", "profile")
    assert run.code == 1
    failed = run.verdicts("profile", "fail")
    assert set(failed) == {"e0"} and "engine process changed" in json.dumps(failed["e0"])


def test_the_router_does_not_bind_a_row_measured_before_the_fleet_was_attested(
        attested: Attested) -> None:
    """A row without the attestation digest (profiled on the draft fleet) is another
    generation for an attested engine: held for reprofile, never priced."""
    fleet = _with_profiles(attested.fleet())
    draft = fleet.with_name("draft.json")
    doc = json.loads(fleet.read_text())
    for e in doc["engines"]:
        del e["attestation_url"], e["contract"]
    draft.write_text(json.dumps(doc))
    done = _profile(draft)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    store = load_profiles(fleet.parent / "profiles.json", model="tiny", engine_ids=("e0",))
    assert store.profiles[0].generation.attestation_digest is None
    router = Router(fleet, free_port()).start(wait_ready=False)
    try:
        _wait("the reprofile hold", lambda: _engine(router)["held_reason"] == "reprofile")
        assert "attested" in _engine(router)["held_detail"]
    finally:
        router.stop()
