"""The cache-layout document: what one live engine allocated, as `narwhal-engine capture` saw it.

Written on the engine host (Gate C), read by the workstation (the live contract), the router
host (narwhal-check's contract gate) and later gates (fabric budget, attestation). Every
reader gets it through `load_cache_layout`: it is a file read from a host, so its size is
bounded and every field is checked before any value is trusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from narwhal.core.document_io import StrictModel, read_json_document, validate_document
from narwhal.core.kv.capture.logs import StartupFacts
from narwhal.core.kv.metadata import AgentMetadata

SCHEMA = "narwhal.cache-layout"
VERSION = 2
MAX_BYTES = 4 << 20  # a capture is a few KB plus config.json; more is not a capture
REFERENCE = "docs/engines.md"


class Started(StrictModel):
    """The runtime identity the capture belongs to (container Id and creation, or pid)."""

    runtime: Literal["docker", "podman", "native"]
    id: str = Field(min_length=1, max_length=256)
    created: str = Field(min_length=1, max_length=128)


class RankCapture(StrictModel):
    """One rank's NIXL side-channel reply, minus addresses and the opaque agent blob."""

    pp_rank: int = Field(ge=0, le=1024)
    tp_rank: int = Field(ge=0, le=1024)
    compatibility_hash: str = Field(min_length=1, max_length=128)
    engine_id: str = Field(max_length=256)
    metadata: AgentMetadata


class Completion(StrictModel):
    prompt: str = Field(max_length=4096)
    text: str = Field(max_length=65536)
    usage: dict[str, Any] | None


class CacheLayout(StrictModel):
    """`narwhal.cache-layout` v2."""

    schema_: Literal["narwhal.cache-layout"] = Field(alias="schema")
    schema_version: Literal[2]
    engine: str = Field(min_length=1, max_length=128)
    launch_record_sha256: str = Field(min_length=64, max_length=64)
    started: Started
    healthy_after_s: float = Field(ge=0)
    version: str = Field(min_length=1, max_length=128)
    models: tuple[str, ...]
    process_start_time_seconds: float = Field(gt=0)
    cache_config_info: tuple[dict[str, str], ...]
    startup: StartupFacts  # what the startup log said
    ranks: tuple[RankCapture, ...] = Field(min_length=1, max_length=4096)
    completion: Completion
    checkpoint_config: dict[str, Any]  # the model's config.json, to predict the geometry


def parse_cache_layout(raw: Any, source: str) -> CacheLayout:
    return validate_document(raw, source, CacheLayout, SCHEMA, VERSION,
                             "capture it again with `narwhal engines`",
                             "capture it again with this revision (`narwhal engines`)",
                             reference=REFERENCE)


def load_cache_layout(path: Path) -> CacheLayout:
    raw = read_json_document(path, "name Gate C's cache-layout-<engine>.json",
                             max_bytes=MAX_BYTES)
    return parse_cache_layout(raw, str(path))
