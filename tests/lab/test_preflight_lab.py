"""Gate F on the lab: `narwhal preflight` after Gates C, D and E, from the workstation namespace.

Both tools run on the router host over its session (host `router` in commands.jsonl): the
profile store is written once per engine generation, and narwhal-check proves every ordered
pair's KV handoff and the contract against Gate C's captures (not SKIP).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.lab.fleet_up import through
from tests.lab.installing import Installer, rows

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]
ENGINES = ["engine-1", "engine-2", "engine-3"]
PAIRS = {f"{a}->{b}" for a in ENGINES for b in ENGINES if a != b}


@pytest.fixture(scope="module")
def attested(installer: Installer) -> Iterator[Installer]:
    with through(installer, "engines", "fabric", "attest") as fleet:
        yield fleet


def _tool_rows(attempt: Path, tool: str) -> list[dict[str, Any]]:
    return [r for r in rows(attempt) if r["argv"] and str(r["argv"][0]).endswith(tool)]


def _verdicts(evidence: dict[str, Any], gate: str) -> dict[str, str]:
    return {v["subject"]: v["status"] for v in evidence["verdicts"] if v["gate"] == gate}


def test_preflight_profiles_each_generation_once_and_proves_every_pair_and_the_contract(
        attested: Installer) -> None:
    op = attested.op
    code, doc = op.json_command("preflight")
    assert code == 0 and doc["verdict"] == "passed", doc
    first = op.last_attempt("preflight")
    profile_runs = _tool_rows(first, "narwhal-profile")
    check_runs = _tool_rows(first, "narwhal-check")
    assert len(profile_runs) == 1 and check_runs
    assert {r["host"] for r in profile_runs + check_runs} == {"router"}
    evidence = json.loads((first / "check-full.json").read_text())
    assert _verdicts(evidence, "kv") == {p: "pass" for p in PAIRS}
    contract = _verdicts(evidence, "contract")
    assert set(contract) >= set(ENGINES) | PAIRS
    assert set(contract.values()) == {"pass"}  # held to Gate C's captures, not SKIP
    fleet = json.loads((op.last_attempt("attest") / "fleet.json").read_text())
    attested_digest = {e["id"]: e["contract"]["attestation_digest"] for e in fleet["engines"]}
    store = json.loads((first / "profiles.json").read_text())
    assert {r["engine_id"]: r["generation"]["attestation_digest"] for r in store["profiles"]} \
        == attested_digest  # each row bound to the attested process

    calibration = json.loads((first / "first-token-calibration.json").read_text())
    assert doc["first_token_candidate_s"] == calibration["candidate_s"] > 0
    final = json.loads((first / "fleet-calibrated.json").read_text())
    assert final["calibration"] == {"path": "first-token-calibration.json"}
    deadline = final.get("serving", {}).get("first_token_timeout_s", 60.0)
    assert calibration["candidate_s"] <= deadline

    code, doc = op.json_command("preflight")
    assert code == 0 and doc["verdict"] == "passed", doc
    second = op.last_attempt("preflight")
    assert second != first
    assert _tool_rows(second, "narwhal-profile") == []  # every row still binds: none profiled
    assert (second / "profiles.json").read_bytes() == (first / "profiles.json").read_bytes()
    assert json.loads((second / "check-generations.json").read_text())["ok"] is True


def test_an_slo_below_the_profiled_decode_floor_fails_the_slo_gate(attested: Installer) -> None:
    op = attested.op
    tight = op.variant("tight-slo", NARWHAL_TPOT_S="0.0001")
    code, doc = op.json_command("preflight", env=tight)
    assert code == 1 and doc["verdict"] == "blocked", doc
    problems = {p["field"]: p for p in doc["problems"]}
    assert {f"slo {e} tpot_s" for e in ENGINES} <= set(problems), sorted(problems)
    assert "tpot_s 0.0001" in json.dumps(problems)
