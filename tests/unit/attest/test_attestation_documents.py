"""Gate E's documents and core's models of them: the attestation a sidecar builds is one the
model reads, unchanged to its digest; the fleet's summary is written byte for byte as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.documents import canonical_json, digest, sha256_bytes
from narwhal.core.engine_attestation import (
    AttestedEngine,
    fleet_attestation,
    parse_attestation,
    parse_fleet_attestation,
)
from narwhal.core.errors import InputError
from narwhal.deploy.gates.attest import AttestPlan, _summary, findings
from narwhal.node.attest.document import build
from tests.unit.attest.test_findings import CAPTURE, LAUNCH_SHA, _sidecar


def _run_dir(tmp_path: Path) -> Path:
    """A run dir as Gate C leaves it: the checked run plan, the started identity, the capture."""
    plan = json.dumps({"engine": "engine-2", "launch_record_sha256": LAUNCH_SHA,
                       "image_id": "sha256:" + "a" * 64, "model_tree_sha256": "b" * 64,
                       "url": "http://127.0.0.1:8000",
                       "argv": ["vllm", "serve", "--kv-transfer-config",
                                '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'],
                       "transfer": {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "fab0"}}).encode()
    (tmp_path / "launch.json").write_bytes(plan)
    (tmp_path / "checked.json").write_text(json.dumps({"plan_sha256": sha256_bytes(plan),
                                                      "ok": True}))
    (tmp_path / "started.json").write_text(json.dumps(CAPTURE["started"]))
    (tmp_path / "cache-layout.json").write_text(json.dumps(CAPTURE))
    return tmp_path


def test_the_sidecars_own_attestation_is_read_by_the_model_to_the_same_digest(
        tmp_path: Path) -> None:
    doc = json.loads(canonical_json(build(_run_dir(tmp_path), "lab").document))
    read = parse_attestation(doc, "attestation-engine-2.json")
    again = read.model_dump(by_alias=True)
    assert canonical_json(again) == canonical_json(doc)
    assert digest({k: v for k, v in again.items() if k != "digest"}) == read.digest
    assert findings(_sidecar(), doc, "lab") == []


def test_an_attestation_of_another_schema_is_refused_by_field(tmp_path: Path) -> None:
    doc = json.loads(canonical_json(build(_run_dir(tmp_path), "lab").document))
    doc["process"] = {**doc["process"], "created": None}
    with pytest.raises(InputError) as got:
        parse_attestation(doc, "attestation-engine-2.json")
    assert [p.field for p in got.value.problems] == ["process.created"]


def _plan() -> AttestPlan:
    return AttestPlan([_sidecar()], {}, "router", {}, {})


def _old_summary(p: AttestPlan, docs: dict[str, dict[str, Any]],
                 kept_roles: set[str]) -> dict[str, Any]:
    """engine-attestation.json as Gate E built it before the model (the bytes to keep)."""
    return {"schema": "narwhal.fleet-attestation", "schema_version": 1,
            "engines": {role: {"url": next(s.url for s in p.sidecars if s.target.role == role),
                               "digest": d.get("digest"),
                               "compatibility_hash": d.get("compatibility_hash"),
                               "process": d.get("process"),
                               "sidecar": "kept" if role in kept_roles else "started"}
                        for role, d in docs.items()}}


@pytest.mark.parametrize("doc", [
    {"digest": "sha256:1", "compatibility_hash": "h", "process": {"id": "c", "x": 1.5}},
    {},  # a sidecar that answered no attestation at all: a blocked attempt keeps what it said
    {"digest": 7, "compatibility_hash": ["odd"], "process": "gone"},
])
@pytest.mark.parametrize("kept", [set(), {"engine-2"}])
def test_the_fleet_summary_is_written_byte_for_byte_as_before(doc: dict[str, Any],
                                                              kept: set[str]) -> None:
    p = _plan()
    new = _summary(p, {"engine-2": doc}, kept)
    assert canonical_json(new) == canonical_json(_old_summary(p, {"engine-2": doc}, kept))
    assert parse_fleet_attestation(json.loads(canonical_json(new)), "s").document() == new


def test_a_summary_row_names_how_its_sidecar_came_to_serve() -> None:
    with pytest.raises(ValueError):
        fleet_attestation({"e": AttestedEngine(url="u", digest=None, compatibility_hash=None,
                                               process=None, sidecar="reused")})  # type: ignore[arg-type]
