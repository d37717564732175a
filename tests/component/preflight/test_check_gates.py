"""narwhal-check over three kv_both emulators on loopback: a healthy fleet passes, and each
broken engine or pair fails the gate that should catch it, by name, with exit 1."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.lab.engine.testing import TINY_LLAMA, running_engine, write_model_dir
from tests.component.preflight.check_fleet import (
    ENGINE_ARGS,
    ENV,
    CheckFleet,
    check_fleet,
    fault,
    profile_row,
    run_check,
)

pytestmark = pytest.mark.timeout(180)
ALL_PAIRS = {"e0->e1", "e0->e2", "e1->e0", "e1->e2", "e2->e0", "e2->e1"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckFleet]:
    with check_fleet(tmp_path_factory.mktemp("check")) as started:
        yield started


@pytest.fixture
def healthy(fleet: CheckFleet) -> Iterator[CheckFleet]:
    """The shared fleet with default documents, and no fault left behind by the test."""
    fleet.write_fleet()
    fleet.write_profiles()
    try:
        yield fleet
    finally:
        fleet.clear_faults()
        fleet.write_fleet()


def test_a_healthy_fleet_passes_every_gate_and_proves_all_six_pairs_moved_kv(
        healthy: CheckFleet) -> None:
    run = run_check(healthy.fleet_path)
    assert run.code == 0, run.failures()
    kv = run.verdicts("kv")
    assert set(kv) == ALL_PAIRS
    for pair, v in kv.items():
        assert v["status"] == "pass", (pair, v)
        assert v["values"]["external_kv_tokens"] == v["values"]["prompt_tokens"] > 32
        assert v["values"]["nixl_transfers"] >= 1 and v["values"]["nixl_bytes"] > 0
        assert 0 < v["values"]["handoff_s"] <= v["values"]["first_token_s"] < 60
    gates = {v["gate"] for v in run.document["verdicts"] if v["status"] == "pass"}
    assert gates == {"reach", "model", "profile", "pace", "tokenize", "kv", "slo"}
    assert run.verdicts("contract")["fleet"]["status"] == "skip"  # no Gate C capture: never PASS
    assert "--captures" in run.verdicts("contract")["fleet"]["detail"]


def test_narwhal_profile_then_check_passes(healthy: CheckFleet) -> None:
    """The runbook's order: profile the live engines, then the check holds them to that store."""
    store = healthy.root / "measured-profiles.json"
    profiled = subprocess.run([sys.executable, "-m", "narwhal.serve.profile_cli", "--fleet",
                               str(healthy.fleet_path), "--out", str(store), "--json"],
                              capture_output=True, text=True, timeout=120, check=False)
    assert profiled.returncode == 0, profiled.stderr[-2000:]
    # Measured curves on a shared 2-core test machine are noisier than a GPU fleet's: the fit
    # limits are widened by their flags (the profiler itself refuses fits beyond 10).
    run = run_check(healthy.write_fleet(profiles={"path": store.name}),
                    "--max-fit-error", "0.6", "--max-loo-error", "1.0")
    assert run.code == 0, run.failures()
    assert {s for s, v in run.verdicts("profile", "pass").items()} == {"e0", "e1", "e2"}
    assert set(run.verdicts("kv", "pass")) == ALL_PAIRS


def test_the_evidence_file_is_private_and_holds_what_the_table_shows(
        healthy: CheckFleet, tmp_path: Path) -> None:
    evidence = tmp_path / "evidence.json"
    run = run_check(healthy.fleet_path, "--evidence", str(evidence), json_out=False)
    assert run.code == 0, run.stdout
    assert stat.S_IMODE(evidence.stat().st_mode) == 0o600
    doc = json.loads(evidence.read_text())
    assert doc["schema"] == "narwhal.preflight-evidence" and doc["ok"] is True
    kv_rows = [v for v in doc["verdicts"] if v["gate"] == "kv"]
    assert {v["subject"] for v in kv_rows} == ALL_PAIRS
    for v in kv_rows:
        assert v["subject"] in run.stdout and v["measured"].split(" (")[0] in run.stdout
    assert run.stdout.splitlines()[-1].startswith("NARWHAL_RESULT ")
    assert f"evidence: {evidence}" in run.stdout


def test_no_tenant_key_reaches_the_output_or_the_evidence(healthy: CheckFleet,
                                                           tmp_path: Path) -> None:
    secret = "sk-narwhal-preflight-0123456789abcdef"
    fleet = healthy.write_fleet(tenants=[{"name": "team-a", "key_env": "NARWHAL_KEY_TEAM_A"}])
    evidence = tmp_path / "evidence.json"
    for json_out in (True, False):
        evidence.unlink(missing_ok=True)
        run = run_check(fleet, "--evidence", str(evidence), json_out=json_out,
                        env={"NARWHAL_KEY_TEAM_A": secret})
        assert run.code in (0, 1), run.stderr
        for text in (run.stdout, run.stderr, evidence.read_text()):
            assert secret not in text


def test_the_default_evidence_file_lands_beside_the_fleet_with_a_utc_timestamp(
        healthy: CheckFleet) -> None:
    before = set(healthy.root.glob("preflight-*Z*.json"))
    run = run_check(healthy.fleet_path)
    assert run.code == 0, run.failures()
    new = set(healthy.root.glob("preflight-*Z*.json")) - before
    assert len(new) == 1 and str(new.pop()) == run.document["evidence"]


def test_ring_checks_n_pairs_and_says_it_is_a_subset(healthy: CheckFleet) -> None:
    run = run_check(healthy.fleet_path, "--ring")
    assert run.code == 0, run.failures()
    pairs = {s for s, v in run.verdicts("kv").items() if "->" in s}
    assert pairs == {"e0->e1", "e1->e2", "e2->e0"}
    note = run.verdicts("kv")["other pairs"]
    assert note["status"] == "skip" and "subset: 3 of 6" in note["detail"]
    human = run_check(healthy.fleet_path, "--ring", json_out=False)
    assert "--ring checked a subset" in human.stdout


def test_an_engine_serving_another_model_fails_the_model_gate_by_name(healthy: CheckFleet) -> None:
    fault(healthy.engines["e1"], "wrong_model", model="other-model")
    run = run_check(healthy.fleet_path)
    assert run.code == 1
    failed = run.verdicts("model", "fail")
    assert set(failed) == {"e1"} and "other-model" in failed["e1"]["detail"]
    kv_skipped = run.verdicts("kv", "skip")
    assert {"e0->e1", "e1->e0", "e1->e2", "e2->e1"} <= set(kv_skipped)
    assert "e1 failed the model gate" in kv_skipped["e0->e1"]["detail"]
    assert run.verdicts("kv")["e0->e2"]["status"] == "pass"


def test_an_engine_with_another_tokenizer_fails_tokenize_and_its_pairs_are_skipped(
        healthy: CheckFleet) -> None:
    """Same model name, another tokenizer config (no BOS): the ids differ, so would the KV."""
    odd_model = write_model_dir(healthy.root / "odd-tokenizer", TINY_LLAMA,
                                {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False})
    with running_engine(odd_model, log_path=healthy.root / "odd.log", extra_args=ENGINE_ARGS,
                        env=ENV) as odd:
        rows = [profile_row(eid, e.port) for eid, e in healthy.engines.items()]
        healthy.write_profiles([*rows, profile_row("odd", odd.port)])
        engines = [{"id": eid, "url": e.url, "role": "both"} for eid, e in healthy.engines.items()]
        run = run_check(healthy.write_fleet(engines=[*engines, {"id": "odd", "url": odd.url,
                                                                "role": "both"}]))
    assert run.code == 1
    failed = run.verdicts("tokenize", "fail")
    assert set(failed) == {"odd"} and "tokenizes differently from e0, e1, e2" in failed["odd"]["detail"]
    assert run.verdicts("kv")["odd->e0"]["status"] == "skip"
    assert run.verdicts("kv")["e0->odd"]["detail"] == "odd failed the tokenize gate"
    assert run.verdicts("kv")["e0->e1"]["status"] == "pass"


def test_a_consumer_that_recomputes_fails_kv_although_tokens_came_back(
        healthy: CheckFleet) -> None:
    fault(healthy.engines["e0"], "recompute_instead_of_pull")
    run = run_check(healthy.fleet_path)
    assert run.code == 1
    failed = run.verdicts("kv", "fail")
    assert set(failed) == {"e1->e0", "e2->e0"}
    for v in failed.values():
        assert "consumer recomputed the prompt instead of pulling its KV" in v["detail"]
        assert v["values"]["external_kv_tokens"] == 0
    assert {s for s, v in run.verdicts("kv", "pass").items()} == ALL_PAIRS - set(failed)


def test_a_slow_engine_fails_the_pace_gate_by_name(healthy: CheckFleet) -> None:
    fault(healthy.engines["e2"], "slow", factor=10.0)
    run = run_check(healthy.fleet_path)
    assert run.code == 1
    failed = run.verdicts("pace", "fail")
    assert set(failed) == {"e2"}
    v = failed["e2"]
    assert "prediction" in v["detail"] and "factor allowed 3" in v["detail"]
    assert v["values"]["seconds"] > 3 * v["values"]["predicted_s"]


def test_an_slo_below_the_profiled_decode_floor_fails_the_slo_gate(healthy: CheckFleet) -> None:
    healthy.write_fleet(slo={"ttft_s": 2.0, "tpot_s": 0.004})  # decode floor is 0.0050128 s
    run = run_check(healthy.fleet_path)
    assert run.code == 1
    failed = run.verdicts("slo", "fail")
    assert set(failed) == {"e0 tpot_s", "e1 tpot_s", "e2 tpot_s"}
    detail = failed["e1 tpot_s"]["detail"]
    assert "floor 0.0050 s" in detail and "slo.tpot_s 0.004 s" in detail


def test_a_restarted_engine_fails_the_profile_gate_and_an_unanswered_handshake_fails_kv(
        healthy: CheckFleet) -> None:
    """A restart is a new generation, and its peers have never shaken hands with the new
    process: set to refuse handshakes, every pair it produces for fails the kv gate."""
    healthy.restart("e2")
    fault(healthy.engines["e2"], "refuse_handshakes")
    run = run_check(healthy.fleet_path)
    assert run.code == 1
    failed = run.verdicts("profile", "fail")
    assert set(failed) == {"e2"}
    detail = failed["e2"]["detail"]
    assert "live" in detail and "profiled" in detail and "--only e2" in detail
    assert run.verdicts("pace")["e2"]["status"] == "skip"
    assert run.verdicts("slo")["e2"]["status"] == "skip"
    assert "e2 failed the profile gate" in run.verdicts("slo")["e2"]["detail"]
    assert set(run.verdicts("kv", "fail")) == {"e2->e0", "e2->e1"}
    assert set(run.verdicts("kv", "pass")) == ALL_PAIRS - {"e2->e0", "e2->e1"}
