"""Every fleet deploy writes (Gate A's draft, Gate E's fleet, Gate F's candidate) is held to
core's FleetDocument where it is made: one the router would refuse is refused there, naming
the field, and one it accepts is written byte for byte as before."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
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


def _fleet_of(hosts: int, per_host: int) -> tuple[AttestPlan, dict[str, Any]]:
    """A fleet of hosts x per_host engines, engine-N's sidecar on 10.1.H.N."""
    sidecars, engines, docs = [], [], {}
    for h in range(hosts):
        for k in range(per_host):
            role = f"engine-{h * per_host + k + 1}"
            s = _sidecar()
            sidecars.append(replace(s, target=replace(s.target, role=role, alias=f"node-{h}"),
                                    bind=f"10.1.{h}.{k + 1}"))
            engines.append({"id": role, "url": f"http://10.1.{h}.{k + 1}:8000", "role": "both"})
            docs[role] = _attested(DIGEST)["engine-2"]
    return AttestPlan(sidecars, {}, "router", {**DRAFT, "engines": engines}, {}), docs


@pytest.mark.parametrize("hosts,per_host", [(31, 1), (10, 2), (63, 1)])
def test_a_fleet_past_the_quorum_bound_gets_a_bounded_odd_quorum_spread_over_its_hosts(
        hosts: int, per_host: int) -> None:
    """Gate E of a 32-host fleet once wrote every sidecar into the quorum, and the router's
    own fleet model refused the document it had just attested."""
    plan, docs = _fleet_of(hosts, per_host)
    quorum = finalised_fleet(plan, docs, "dep", "lease.key")["controller"]["quorum"]
    urls = quorum["lease_urls"]
    assert len(urls) == 15 and len(set(urls)) == 15
    members = [s for s in plan.sidecars if s.lease_url in urls]
    per_member_host = Counter(s.target.alias for s in members)
    assert len(per_member_host) == min(hosts, 15)  # one per host before any host gets two
    assert max(per_member_host.values()) - min(per_member_host.values()) <= 1


def test_a_fleet_within_the_quorum_bound_asks_every_sidecar() -> None:
    plan, docs = _fleet_of(5, 3)
    quorum = finalised_fleet(plan, docs, "dep", "lease.key")["controller"]["quorum"]
    assert quorum["lease_urls"] == [s.lease_url for s in plan.sidecars]
