"""Gate E holds each attestation to Gate C's capture of that engine: every way a document can
fail to vouch for it is refused with a named reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.core.cache_layout import parse_cache_layout
from narwhal.core.documents import digest
from narwhal.core.launch_record import LaunchRecord
from narwhal.deploy.gates.attest import Sidecar, findings
from narwhal.deploy.gates.engines import EngineTarget

HASH = "a1b2c3" * 10
LAUNCH_SHA = "f" * 64
METADATA = {"num_regions": 1, "block_lens": [1], "block_strides": [1], "block_size": 16,
            "kv_cache_layout": "HND", "ssm_sizes": [], "attn_backend_name": "x",
            "physical_blocks_per_logical_kv_block": 1, "num_blocks": None, "dcp_size": 1,
            "pcp_size": 1}


CAPTURE: dict[str, Any] = {
    "schema": "narwhal.cache-layout", "schema_version": 2, "engine": "engine-2",
    "launch_record_sha256": LAUNCH_SHA,
    "started": {"runtime": "docker", "id": "c" * 64, "created": "2026-12-01T00:00:00Z"},
    "healthy_after_s": 0.5, "version": "0.32.0", "models": ["m"],
    "process_start_time_seconds": 1764547200.25, "cache_config_info": [],
    "startup": {"kv_cache_layout": "HND", "attention_backends": [], "available_kv_gib": None,
                "kv_cache_tokens": None, "max_model_len": None, "max_concurrency": None,
                "device": None, "compatibility_hash_passed": None},
    "ranks": [{"pp_rank": 0, "tp_rank": 0, "compatibility_hash": HASH, "engine_id": "x",
               "metadata": METADATA}],
    "completion": {"prompt": "p", "text": "t", "usage": None}, "checkpoint_config": {}}


def _sidecar() -> Sidecar:
    record = LaunchRecord.model_validate_json(json.dumps({
        "schema": "narwhal.launch-record", "schema_version": 1, "engine": "engine-2",
        "host": "node-2", "runtime": "docker", "image": {"ref": "x", "id": "sha256:" + "a" * 64},
        "accelerator": "none", "tensor_parallel_size": 1, "model_dir": "/m",
        "model_tree_sha256": "b" * 64, "served_model_name": "m", "run_dir": "/srv",
        "fabric_interface": "fab0", "fabric_address": "10.0.0.2",
        "ports": {"engine": 8000, "attest": 8100, "nixl_side_channel": 5600,
                  "ucx_tcp": [30000, 30100]},
        "kv_transfer_config": {}, "environment": {}, "vllm_args": []}))
    capture = parse_cache_layout(CAPTURE, "capture")
    return Sidecar(EngineTarget("engine-2", "node-2", record, LAUNCH_SHA), capture,
                   "10.0.0.2", 8100)


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "narwhal.engine-attestation", "schema_version": 1, "deployment": "lab",
        "engine": "engine-2", "launch_record_sha256": LAUNCH_SHA, "compatibility_hash": HASH,
        "vllm_version": "0.32.0", "process": {"runtime": "docker", "id": "c" * 64,
                                              "created": "2026-12-01T00:00:00Z",
                                              "process_start_time_seconds": 1764547200.25},
        "checked_plan_sha256": "e" * 64, "image_id": "sha256:" + "a" * 64,
        "model_tree_sha256": "b" * 64, "kv_transfer_config": {"kv_connector": "NixlConnector"},
        "model": {"num_hidden_layers": 2},
        "cache_layout": {"kv_cache_layout": "HND", "attention_backends": [],
                         "cache_config_info": [], "ranks": []},
        "transfer": {"mode": "pull", "role": "kv_both", "handshake": "x", "path": None}}
    doc.update(changes)
    doc["digest"] = digest(doc)
    return doc


def test_the_attestation_of_the_captured_engine_passes() -> None:
    assert findings(_sidecar(), _doc(), "lab") == []


@pytest.mark.parametrize(("changes", "said"), [
    ({"engine": "engine-3"}, "engine is 'engine-3'"),  # a sidecar pointed at another engine
    ({"deployment": "prod"}, "deployment is 'prod'"),  # a sidecar of another deployment
    ({"schema_version": 2}, "schema_version is 2"),
    ({"compatibility_hash": "0" * 60}, "compatibility_hash"),
    ({"process": {"runtime": "docker", "id": "c" * 64, "process_start_time_seconds": 1.0}},
     "process start 1.0 is not the captured"),
    ({"process": {"runtime": "docker", "id": "d" * 64,
                  "process_start_time_seconds": 1764547200.25}}, "not the one Gate C started"),
])
def test_each_way_to_not_vouch_for_the_engine_is_named(changes: dict[str, Any],
                                                       said: str) -> None:
    assert any(said in f for f in findings(_sidecar(), _doc(**changes), "lab"))


def test_a_tampered_document_fails_its_own_digest() -> None:
    doc = _doc()
    assert findings(_sidecar(), doc, "lab") == []
    doc["process"] = {**doc["process"], "runtime": "native"}  # edited after signing
    assert findings(_sidecar(), doc, "lab") == [
        "the document's digest does not match its content (tampered)"]


def test_an_attestation_that_vouches_but_breaks_its_schema_is_refused_by_field() -> None:
    """What Gate E passes its readers parse: a signed document missing a field, or with one
    the schema does not know, is named field by field, not kept."""
    doc = _doc()
    del doc["image_id"]
    doc["extra"] = 1
    doc["digest"] = digest({k: v for k, v in doc.items() if k != "digest"})
    said = findings(_sidecar(), doc, "lab")
    assert any(f.startswith("image_id: field required") for f in said)
    assert any(f.startswith("extra: unknown key") for f in said)


def test_the_named_findings_come_first_and_alone() -> None:
    """A document that does not vouch for the engine is told so in the words operators know;
    the schema check adds nothing to them."""
    doc = _doc(engine="engine-3")
    doc["extra"] = 1
    assert findings(_sidecar(), doc, "lab") == [
        "engine is 'engine-3', expected 'engine-2'",
        "the document's digest does not match its content (tampered)"]
