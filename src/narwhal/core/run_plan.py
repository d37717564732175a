"""The engine run plan (`narwhal.engine-run-plan` v1): a launch record made concrete for one
host by `narwhal-engine prepare`, written as launch.json, and read back by `check`, `start`,
`capture`, the idle proof and the attestation sidecar.

Its digest is what `check` passed and `start` refuses to see changed, so every reader takes it
through this model: a plan edited by hand into something `start` would misread is refused
naming the field, never half-run.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from narwhal.core.document_io import StrictModel, parse_json_bytes, validate_document
from narwhal.core.launch_record import Device, Ports
from narwhal.core.transfer_path import TransferPath

SCHEMA = "narwhal.engine-run-plan"
VERSION = 1
REFERENCE = "docs/engines.md"


class SideChannel(StrictModel):
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)


class RunPlan(StrictModel):
    schema_: Literal["narwhal.engine-run-plan"] = Field(alias="schema")
    schema_version: Literal[1]
    engine: str = Field(min_length=1)
    launch_record_sha256: str = Field(min_length=64, max_length=64)
    runtime: Literal["docker", "podman", "native"]
    container_name: str | None
    argv: tuple[str, ...] = Field(min_length=1)
    environment: dict[str, str]
    secret_environment: tuple[str, ...]
    image_id: str = Field(min_length=1)
    accelerator: Literal["nvidia", "amd", "none"]
    devices: tuple[Device, ...]
    tensor_parallel_size: int = Field(ge=1)
    model_dir: str = Field(min_length=1)
    model_tree_sha256: str = Field(min_length=64, max_length=64)
    run_dir: str = Field(min_length=1)
    served_model_name: str = Field(min_length=1)
    vllm_args: tuple[str, ...]
    fabric_interface: str = Field(min_length=1)
    fabric_address: str = Field(min_length=1)
    ports: Ports
    side_channel: SideChannel
    transfer: TransferPath | None
    url: str = Field(min_length=1)
    # where `start` reads the secrets' 0600 files (prepare --secrets); absent: given to start
    secrets_dir: str | None = None


def checked_plan(doc: dict[str, Any], source: str) -> dict[str, Any]:
    """`doc` as written, once it is a valid run plan (InputError naming each bad field)."""
    validate_document(doc, source, RunPlan, SCHEMA, VERSION,
                      "write the run plan with `narwhal-engine prepare`",
                      "prepare the plan again with this build's `narwhal-engine prepare`",
                      reference=REFERENCE)
    return doc


def read_plan(data: bytes, source: str) -> dict[str, Any]:
    """A run plan's bytes as the document its readers use, validated first."""
    raw = parse_json_bytes(data, source)
    return checked_plan(raw, source)
