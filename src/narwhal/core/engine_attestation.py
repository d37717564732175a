"""Gate E's documents as strict models: one engine's attestation (attestation-<engine>.json,
as its sidecar answered it) and the fleet's summary of them (engine-attestation.json).

An attestation is the sidecar's own signed document (node/attest/document.py builds it): Gate
E keeps it as it came, byte for byte, since its digest is over exactly that content, and holds
it to `EngineAttestation` before trusting it; `narwhal status` and Gate E's next attempt read
it back through the same model. The summary is built through `FleetAttestation`. Parts that
are other documents quoted as they came (the engine's connector config, its model config, the
capture's ranks, the UCX path) stay JSON values here.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError

from narwhal.core.document_io import StrictModel, problems_from, validate_document

SCHEMA = "narwhal.engine-attestation"
FLEET_SCHEMA = "narwhal.fleet-attestation"
VERSION = 1
REFERENCE = "docs/attest.md"
FIX_OBJECT = "run `narwhal attest` again (the gate writes this document)"
FIX_VERSION = "run `narwhal attest` again with this revision"


class AttestedProcess(StrictModel):
    """The runtime identity and start time the sidecar binds the attestation to."""

    runtime: str
    id: str
    created: str
    process_start_time_seconds: float


class AttestedLayout(StrictModel):
    """The cache the engine allocated, as Gate C captured it."""

    kv_cache_layout: str
    attention_backends: list[str]
    cache_config_info: list[dict[str, str]]
    ranks: list[dict[str, Any]]  # each rank's capture, as cache-layout.json holds it


class EngineAttestation(StrictModel):
    """`narwhal.engine-attestation` v1: one live engine, bound to its process, with its digest."""

    schema_: Literal["narwhal.engine-attestation"] = Field(alias="schema")
    schema_version: Literal[1]
    deployment: str
    engine: str
    process: AttestedProcess
    launch_record_sha256: str
    checked_plan_sha256: str
    image_id: str
    model_tree_sha256: str
    vllm_version: str
    kv_transfer_config: dict[str, Any]
    model: dict[str, Any]  # the architecture fields of the model's config.json
    cache_layout: AttestedLayout
    compatibility_hash: str
    transfer: dict[str, Any]  # mode, role, handshake and the UCX path Gate D measured
    digest: str  # of every other key, canonical JSON (core/documents.py)


class AttestedEngine(StrictModel):
    """One engine's row in engine-attestation.json.

    `digest`, `compatibility_hash` and `process` are copied from the sidecar's answer as it
    came: a blocked attempt keeps the summary of what every sidecar said, even an answer
    that is not an attestation at all, so they are not typed here."""

    url: str
    digest: Any
    compatibility_hash: Any
    process: Any
    sidecar: Literal["kept", "started"]


class FleetAttestation(StrictModel):
    """`narwhal.fleet-attestation` v1 (engine-attestation.json): every engine's sidecar."""

    schema_: Literal["narwhal.fleet-attestation"] = Field(alias="schema")
    schema_version: Literal[1]
    engines: dict[str, AttestedEngine]

    def document(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


def fleet_attestation(engines: dict[str, AttestedEngine]) -> FleetAttestation:
    return FleetAttestation.model_validate(
        {"schema": FLEET_SCHEMA, "schema_version": VERSION, "engines": engines})


def attestation_findings(doc: Any) -> list[str]:
    """Every way `doc` is not an EngineAttestation, one named line each (empty: it is one)."""
    try:
        EngineAttestation.model_validate_json(json.dumps(doc))
    except ValidationError as exc:
        return [f"{p.field}: {p.problem}"
                for p in problems_from(exc, EngineAttestation, reference=REFERENCE)]
    return []


def parse_attestation(raw: Any, source: str) -> EngineAttestation:
    return validate_document(raw, source, EngineAttestation, SCHEMA, VERSION, FIX_OBJECT,
                             FIX_VERSION, reference=REFERENCE)


def parse_fleet_attestation(raw: Any, source: str) -> FleetAttestation:
    return validate_document(raw, source, FleetAttestation, FLEET_SCHEMA, VERSION, FIX_OBJECT,
                             FIX_VERSION, reference=REFERENCE)
