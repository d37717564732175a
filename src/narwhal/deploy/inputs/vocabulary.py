"""The `.env` vocabulary: which variables exist, which are per-engine, which are required.

`NARWHAL_<FIELD>` sets a fleet-wide value; `NARWHAL_NODE_<n>_<FIELD>` overrides it for engine n.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict

from narwhal.core.document_io import StrictModel
from narwhal.deploy.inputs import fields as f

# FIELD suffix -> attribute name, for fields that may be global or per engine.
ENGINE_FIELDS: dict[str, str] = {
    "ENGINE_IMAGE": "engine_image",
    "ENGINE_MODEL_NAME": "model_name",
    "MODEL_DIR": "model_dir",
    "RUN_DIR": "run_dir",
    "FABRIC_INTERFACE": "fabric_interface",
    "ENGINE_PORT": "engine_port",
    "ATTEST_PORT": "attest_port",
    "NIXL_SIDE_CHANNEL_PORT": "nixl_side_channel_port",
    "KV_EVENTS_PORT": "kv_events_port",
    "UCX_TCP_PORT_RANGE": "ucx_tcp_port_range",
    "GPU_IDS": "gpu_ids",
    "TENSOR_PARALLEL_SIZE": "tensor_parallel_size",
    "MODEL_DTYPE": "model_dtype",
    "BLOCK_SIZE": "block_size",
    "ENGINE_ARGS": "engine_args",
    "ENGINE_ENV": "engine_env",
    "TRANSFER_TRANSPORT": "transfer_transport",
    "TRANSFER_NET_DEVICES": "transfer_net_devices",
    "TRANSFER_DEVICES": "transfer_devices",
    "GPU_TLS": "gpu_tls",
    "KV_BUFFER_DEVICE": "kv_buffer_device",
    "MODEL_CONFIG_SHA256": "model_config_sha256",
    "GPU_MEMORY_UTILIZATION": "gpu_memory_utilization",
}
REQUIRED_ENGINE_FIELDS = (
    "ENGINE_IMAGE", "ENGINE_MODEL_NAME", "MODEL_DIR", "RUN_DIR", "FABRIC_INTERFACE",
    "ENGINE_PORT", "ATTEST_PORT", "NIXL_SIDE_CHANNEL_PORT", "UCX_TCP_PORT_RANGE",
)
# Per-engine only (no global form).
NODE_ONLY: dict[str, str] = {
    "SSH": "ssh",
    "SSH_PASSWORD": "ssh_password",
    "SSH_KEY": "ssh_key",
    "IP": "ip",
    "URL": "url",
    "ATTESTATION_URL": "attestation_url",
}
# Fleet-wide only.
GLOBAL_ONLY: set[str] = {
    "DEPLOYMENT", "DEPLOYMENT_REVISION", "ROUTER_SSH", "ROUTER_SSH_PASSWORD", "ROUTER_SSH_KEY",
    "ROUTER_URL", "ROUTER_STANDBY_URL", "ROUTER_API_KEY", "SSH_KEY", "SSH_KNOWN_HOSTS", "SSH_CONNECT_TIMEOUT",
    "TTFT_S", "TPOT_S", "ENGINE_KEY", "HF_TOKEN", "GRAFANA_BIND_ADDRESS",
    "PROMETHEUS_LISTEN_ADDRESS", "SHARED_GPU_ALLOWANCE", "KV_CANARY_INTERVAL_S",
}
# Variables outside the NARWHAL_ namespace that the .env may hold: the runbook's names for the
# checkpoint to stage, and the hub endpoint setting huggingface_hub users already write.
OTHER_KNOWN: set[str] = {"MODEL_REPO_ID", "MODEL_REVISION", "HF_ENDPOINT"}
# Variables the runbook names that nothing acts on yet: refused with why, rather than
# accepted and ignored (a field that does nothing is a promise nobody keeps). None today.
NOT_YET: dict[str, tuple[str, str]] = {}
# Optional single-valued variables: full name -> (Inputs attribute, field type). Each is checked
# with its type's grammar and reported under its own name.
OPTIONAL_TYPED: dict[str, tuple[str, Any]] = {
    "NARWHAL_GRAFANA_BIND_ADDRESS": ("grafana_bind_address", f.IpText),
    "NARWHAL_PROMETHEUS_LISTEN_ADDRESS": ("prometheus_listen_address", f.ListenAddress),
    "NARWHAL_SHARED_GPU_ALLOWANCE": ("shared_gpu_allowance", f.Boolean),
    # the fleet's kv_canary.interval_s, which Gate F writes (each pair probed once per interval)
    "NARWHAL_KV_CANARY_INTERVAL_S": ("kv_canary_interval_s", f.CanaryInterval),
}


# The workload the fleet is sized for (Gate D's budget, the trial): full name -> (Workload
# attribute, field type). Optional and fleet-wide; the defaults live on model.Workload.
WORKLOAD_TYPED: dict[str, tuple[str, Any]] = {
    "NARWHAL_WORKLOAD_PROMPT_TOKENS": ("prompt_tokens", f.PromptTokens),
    "NARWHAL_WORKLOAD_HANDOFFS_PER_S": ("handoffs_per_s", f.AboveZero),
    "NARWHAL_WORKLOAD_BURST": ("burst", f.BurstHandoffs),
    "NARWHAL_WORKLOAD_TRANSFER_BUDGET_MS": ("transfer_budget_ms", f.AboveZero),
    "NARWHAL_WORKLOAD_HEADROOM": ("headroom", f.AtLeastOne),
}
GLOBAL_ONLY |= {name.removeprefix("NARWHAL_") for name in WORKLOAD_TYPED}


class EngineFieldValues(StrictModel):
    """Validation of one engine's merged string values; errors come back per field."""

    # Its values are `.env` strings that the annotated types convert (lax parsing is the
    # point: "8000" is a port) and that refuse NaN with their own words (fields.py); it was
    # never frozen, so it stays as it was.
    model_config = ConfigDict(strict=False, frozen=False, allow_inf_nan=True)

    engine_image: f.ImageRef
    model_name: f.ModelName
    model_dir: f.AbsPath
    run_dir: f.AbsPath
    fabric_interface: f.Interface
    engine_port: f.Port
    attest_port: f.Port
    nixl_side_channel_port: f.Port
    kv_events_port: f.Port | None = None  # unset: the engine publishes no KV events
    ucx_tcp_port_range: f.PortRange
    gpu_ids: f.GpuIds | None = None
    tensor_parallel_size: f.PositiveInt | None = None
    model_dtype: Literal["bfloat16", "float16"] | None = None
    block_size: f.BlockSize = 128
    engine_args: f.EngineArgs | None = None
    engine_env: f.EngineEnv | None = None
    transfer_transport: Literal["ucx_tcp", "ucx_rdma"] = "ucx_tcp"
    transfer_net_devices: f.SafeText | None = None
    transfer_devices: f.DeviceList = ()
    gpu_tls: Literal["cuda", "cuda_copy", "rocm"] | None = None
    kv_buffer_device: Literal["cuda", "cpu"] | None = None
    model_config_sha256: f.Sha256Hex | None = None
    gpu_memory_utilization: f.Fraction | None = None
    ip: f.IpText | None = None
    url: str | None = None
    attestation_url: str | None = None
    ssh_key: f.AbsPath | None = None
