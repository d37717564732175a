"""Digests of the named inputs that define each gate (secrets excluded: a digest of a password
would be a guessable copy of it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from narwhal.core.documents import digest
from narwhal.core.secret import MASK, Secret
from narwhal.deploy.inputs.model import Inputs


def _file_digest(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return digest(Path(path).read_bytes().hex())
    except OSError:
        return "missing"


def _public(value: Any) -> Any:
    """value with every Secret (an ENGINE_ENV token) replaced by the mask."""
    if isinstance(value, Secret):
        return MASK
    if isinstance(value, dict):
        return {k: _public(v) for k, v in value.items()}
    return value


def input_values(inputs: Inputs) -> dict[str, Any]:
    """The plain values behind each named input."""
    engines = inputs.engines

    def per_engine(*attrs: str) -> dict[str, Any]:
        return {e.role: {a: _public(getattr(e, a)) for a in attrs} for e in engines}

    return {
        "revision": inputs.revision,
        "hosts": {"router": inputs.router.ssh.text, **{e.role: e.ssh.text for e in engines}},
        "engine-image": per_engine("engine_image"),
        "model": per_engine("model_name", "model_dir", "model_config_sha256"),
        "launch-policy": per_engine("gpu_ids", "tensor_parallel_size", "model_dtype",
                                    "block_size", "engine_args", "engine_env", "run_dir",
                                    "gpu_memory_utilization", "kv_buffer_device"),
        "fabric": per_engine("fabric_interface", "ip"),
        "transport": per_engine("transfer_transport", "transfer_net_devices",
                                "transfer_devices", "gpu_tls", "ucx_tcp_port_range"),
        "ports": per_engine("engine_port", "attest_port", "nixl_side_channel_port", "url",
                            "attestation_url"),
        "ssh-keys": {"known_hosts": _file_digest(inputs.known_hosts),
                     "keys": sorted({k for k in [inputs.ssh_key, inputs.router.ssh_key,
                                                 *[e.ssh_key for e in engines]] if k})},
        "slo": {"ttft_s": inputs.ttft_s, "tpot_s": inputs.tpot_s},
        # what Gate A stages and pins: a new repo, revision or hub is a new checkpoint
        "checkpoint": inputs.checkpoint.model_dump() if inputs.checkpoint else {},
        # Gate F writes it as the fleet's kv_canary.interval_s; the router reads it at start
        "kv-canary": {"interval_s": inputs.kv_canary_interval_s},
        # Gate F writes it as the fleet's serving.handoff_budget_s, the handoff's deadline
        "handoff-budget": {"transfer_budget_ms": inputs.workload.transfer_budget_ms},
        "router": {"url": inputs.router.url,
                   **({"standby_url": inputs.router.standby_url}
                      if inputs.router.standby_url else {}),
                   # Gate G starts Prometheus there and writes Grafana's server.ini with it
                   **({"prometheus_listen": inputs.prometheus_listen_address}
                      if inputs.prometheus_listen_address else {}),
                   **({"grafana_bind": inputs.grafana_bind_address}
                      if inputs.grafana_bind_address else {})},
        "workload": inputs.workload.model_dump(),
        # which credentials are set, never their values: setting or removing one changes the
        # launch records and the fleet Gate A writes (secret_environment, tenants,
        # engine_auth). A key rotated in place is taken up by `narwhal install` then restarts.
        "credentials": {"engine_key": inputs.engine_key is not None,
                        "router_api_key": inputs.router.api_key is not None,
                        "hf_token": inputs.hf_token is not None},
    }


def gate_fingerprints(inputs: Inputs, declared: Mapping[str, Sequence[str]]
                      ) -> dict[str, dict[str, str]]:
    """For every gate, the digest of each input it declares (`declared`: gate -> input names,
    from the gates' specs)."""
    values = input_values(inputs)
    return {gate: {name: digest(values[name]) for name in names}
            for gate, names in declared.items()}
