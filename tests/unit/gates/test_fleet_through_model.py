"""Every fleet deploy writes (Gate A's draft, Gate E's fleet, Gate F's candidate) is held to
core's FleetDocument where it is made: one the router would refuse is refused there, naming
the field, and one it accepts is written byte for byte as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from narwhal.core.documents import canonical_json
from narwhal.core.errors import InputError
from narwhal.core.fleet import checked_fleet
from narwhal.deploy.gates.attest import AttestPlan, finalised_fleet
from narwhal.deploy.gates.generated import fleet_draft
from tests.unit.attest.test_findings import HASH, LAUNCH_SHA, _sidecar
from tests.unit.gates.test_credentials import _inputs, _plan

DIGEST = "sha256:" + "d" * 64
DRAFT: dict[str, Any] = {
    "schema": "narwhal.fleet", "schema_version": 1, "model": "m",
    "engines": [{"id": "engine-2", "url": "http://10.0.0.2:8000", "role": "both"}],
    "slo": {"ttft_s": 10, "tpot_s": 0.125}, "journal": {"path": "journal.jsonl"}}


def _attested(digest: str) -> dict[str, Any]:
    return {"engine-2": {"compatibility_hash": HASH, "launch_record_sha256": LAUNCH_SHA,
                         "digest": digest}}


def test_gate_a_refuses_a_draft_the_router_would_refuse_naming_the_field(
        tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, NARWHAL_TTFT_S="900")  # the .env takes it; the fleet's SLO not
    with pytest.raises(InputError) as refused:
        fleet_draft(inputs, [_plan(inputs)])
    assert refused.value.source.startswith("fleet-draft.json")
    assert [p.field for p in refused.value.problems] == ["slo.ttft_s"]


def test_gate_e_refuses_a_fleet_whose_contract_the_router_would_refuse() -> None:
    plan = AttestPlan([_sidecar()], {}, "router", DRAFT, {})
    with pytest.raises(InputError) as refused:
        finalised_fleet(plan, _attested("not-a-digest"), "dep", "lease.key")
    assert refused.value.source == "fleet.json (Gate E)"
    assert "engines[0].contract.attestation_digest" in [p.field for p in refused.value.problems]


def test_gate_e_writes_the_fleet_it_always_wrote_byte_for_byte() -> None:
    """Validation adds nothing: no defaults filled in, 10 stays 10 (not 10.0)."""
    fleet = finalised_fleet(AttestPlan([_sidecar()], {}, "router", DRAFT, {}),
                            _attested(DIGEST), "dep", "lease.key")
    s = _sidecar()
    assert canonical_json(fleet) == canonical_json({**DRAFT, "engines": [{
        **DRAFT["engines"][0], "attestation_url": s.url,
        "contract": {"compatibility_hash": HASH, "launch_record_sha256": LAUNCH_SHA,
                     "attestation_digest": DIGEST}}]})


def test_a_checked_fleet_is_the_document_as_built_or_every_problem_at_once() -> None:
    assert checked_fleet(DRAFT, "x") is DRAFT
    bad = {**DRAFT, "slo": {"ttft_s": 0, "tpot_s": 0.125}, "jornal": {}}
    with pytest.raises(InputError) as refused:
        checked_fleet(bad, "fleet-candidate.json")
    assert {p.field for p in refused.value.problems} == {"slo.ttft_s", "jornal"}
