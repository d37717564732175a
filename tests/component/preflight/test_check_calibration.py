"""--calibrate-first-token writes a candidate deadline with its rule, and a fleet whose
deadline is below it is refused by the router (exit 2) and by the check's kv gate."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.core.calibration import load_calibration
from tests.component.preflight.check_fleet import CheckFleet, check_fleet, run_check
from tests.component.serve.harness import Router, free_port

pytestmark = pytest.mark.timeout(180)
SERVE = Path(sys.executable).parent / "narwhal-serve"


@pytest.fixture(scope="module")
def pair_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckFleet]:
    with check_fleet(tmp_path_factory.mktemp("calibrate"), ids=("p0", "p1")) as started:
        yield started


@pytest.fixture(scope="module")
def calibrated(pair_fleet: CheckFleet) -> tuple[CheckFleet, Path, str]:
    out = pair_fleet.root / "first-token.json"
    run = run_check(pair_fleet.fleet_path, "--calibrate-first-token", "--calibrate-repeats", "2",
                    "--calibrate-max-tokens", "128", "--calibration-out", str(out), json_out=False)
    assert run.code == 0, run.stdout + run.stderr
    return pair_fleet, out, run.stdout


def test_calibration_samples_every_pair_and_length_and_states_its_rule(
        calibrated: tuple[CheckFleet, Path, str]) -> None:
    _, out, stdout = calibrated
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    cal = load_calibration(out)
    assert {(p.producer, p.consumer) for p in cal.pairs} == {("p0", "p1"), ("p1", "p0")}
    lengths = [len(p.lengths) for p in cal.pairs]
    assert lengths == [3, 3] and all(len(s.samples_s) == 2 for p in cal.pairs for s in p.lengths)
    worst = max(s.p95_s for p in cal.pairs for s in p.lengths)
    assert worst * cal.safety_factor <= cal.candidate_s < worst * cal.safety_factor + 0.1 + 1e-9
    assert cal.model == "tiny" and {g.engine_id for g in cal.generations} == {"p0", "p1"}
    assert f"calibrated first-token candidate: {cal.candidate_s:g} s" in stdout
    assert f"rule: {cal.rule}" in stdout and "p95" in cal.rule and "safety factor 2" in cal.rule


def test_the_router_refuses_a_deadline_below_the_calibrated_candidate(
        calibrated: tuple[CheckFleet, Path, str]) -> None:
    fleet, out, _ = calibrated
    candidate = load_calibration(out).candidate_s
    path = fleet.write_fleet(calibration={"path": out.name},
                             serving={"first_token_timeout_s": candidate / 2})
    done = subprocess.run([str(SERVE), "--fleet", str(path), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "serving.first_token_timeout_s" in done.stderr
    assert f"{candidate / 2:g} s is below the calibrated candidate {candidate:g} s" in done.stderr
    assert str(out) in done.stderr

    check = run_check(path)  # the check says the same on its kv gate
    assert check.code == 1
    verdict = check.verdicts("kv", "fail")["fleet deadline"]
    assert verdict["values"]["candidate_s"] == candidate


def test_the_router_starts_and_the_check_passes_at_or_above_the_candidate(
        calibrated: tuple[CheckFleet, Path, str]) -> None:
    fleet, out, _ = calibrated
    candidate = load_calibration(out).candidate_s
    path = fleet.write_fleet(calibration={"path": out.name},
                             serving={"first_token_timeout_s": candidate})
    check = run_check(path)
    assert check.code == 0, check.failures()
    assert check.verdicts("kv")["fleet deadline"]["status"] == "pass"
    assert check.document is not None
    assert check.document["deadline"]["calibrated_candidate_s"] == candidate
    router = Router(path, free_port())
    try:
        router.start(wait_ready=False)
    finally:
        if router.proc is not None:
            router.stop()
    assert "calibrat" not in router.stderr


def test_a_calibration_of_another_model_is_refused_by_the_router(
        calibrated: tuple[CheckFleet, Path, str]) -> None:
    fleet, out, _ = calibrated
    other = out.with_name("other-model.json")
    doc = json.loads(out.read_text())
    doc["model"] = "another"
    other.write_text(json.dumps(doc))
    path = fleet.write_fleet(calibration={"path": other.name},
                             serving={"first_token_timeout_s": 600})
    done = subprocess.run([str(SERVE), "--fleet", str(path), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "'another'" in done.stderr and "calibration.path" in done.stderr
