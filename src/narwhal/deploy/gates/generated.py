"""The configuration discovery generates: one launch record per engine and a draft fleet.

Written only after every check passed (discover.py); built from the measured facts (GPU
UUIDs and bus ids, the fabric address, image Id, checkpoint digest), never from what was typed.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

from narwhal.core import fleet as fl
from narwhal.core import launch_record as lr
from narwhal.core.documents import stamp
from narwhal.core.secret import Secret
from narwhal.deploy.gates.discover_checks import EnginePlan
from narwhal.deploy.inputs.model import EngineInputs, Inputs

KV_BOTH = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
# vLLM's flag (0.29 and 0.32) that adds usage.prompt_tokens_details.cached_tokens to answers
PROMPT_TOKENS_DETAILS = "--enable-prompt-tokens-details"
EVENTS_TOPIC = ""  # every batch; one engine per endpoint, so a topic would tell nothing apart


def engine_url(plan: EnginePlan) -> str:
    e = plan.engine
    return e.url or f"http://{plan.fabric_address}:{e.engine_port}"


def bind_host(plan: EnginePlan) -> str | None:
    """The address the engine binds: the one the fleet reaches it at (its URL's host, the
    fabric address by default), when that is an IP; None leaves vLLM's default (every
    interface), for a URL by name or an operator's own --host in NARWHAL_ENGINE_ARGS."""
    if "--host" in (plan.engine.engine_args or ()) or any(
            a.startswith("--host=") for a in plan.engine.engine_args or ()):
        return None
    host = urlsplit(engine_url(plan)).hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return host


def events_config(port: int) -> str:
    """vLLM's --kv-events-config for a ZMQ publisher on `port`. The endpoint must be a
    wildcard: vLLM's publisher binds an endpoint holding `*` (or `::`) and connects to any
    other, so `tcp://<fabric address>:PORT` would make the engine dial out instead of listen."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": f"tcp://*:{port}", "topic": EVENTS_TOPIC},
                      separators=(",", ":"))


def ports(e: EngineInputs) -> dict[str, Any]:
    """The launch record's ports; `kv_events` only when the engine publishes, so records of
    engines without events stay byte-identical to those written before the field existed."""
    out: dict[str, Any] = {"engine": e.engine_port, "attest": e.attest_port,
                           "nixl_side_channel": e.nixl_side_channel_port,
                           "ucx_tcp": list(e.ucx_tcp_port_range)}
    if e.kv_events_port is not None:
        out["kv_events"] = e.kv_events_port
    return out


def launch_record(inputs: Inputs, plan: EnginePlan) -> dict[str, Any]:
    """The stamped `narwhal.launch-record` v1 document for one engine (validated here)."""
    e = plan.engine
    env: dict[str, str] = {"VLLM_NIXL_SIDE_CHANNEL_HOST": plan.fabric_address,
                           "VLLM_NIXL_SIDE_CHANNEL_PORT": str(e.nixl_side_channel_port)}
    secret_names: list[str] = []
    for name, value in (e.engine_env or {}).items():
        if isinstance(value, Secret):
            secret_names.append(name)
        else:
            env[name] = value
    if inputs.checkpoint is not None and "HF_HUB_OFFLINE" not in env:
        # Gate A staged the pinned commit: vLLM's hub client never reaches out at start
        env["HF_HUB_OFFLINE"] = "1"
    if inputs.engine_key is not None:  # vLLM's API key, from its 0600 file at start
        secret_names.append(lr.ENGINE_API_KEY_ENV)
    # NARWHAL_HF_TOKEN: what huggingface_hub inside vLLM reads for a gated repo's files,
    # unless the engine environment names its own
    if inputs.hf_token is not None and lr.HF_TOKEN_ENV not in (e.engine_env or {}):
        secret_names.append(lr.HF_TOKEN_ENV)
    args = ["--served-model-name", e.model_name, "--port", str(e.engine_port),
            "--tensor-parallel-size", str(plan.tensor_parallel_size),
            "--block-size", str(e.block_size)]
    bind = bind_host(plan)
    if bind is not None:
        args += ["--host", bind]
    if e.model_dtype:
        args += ["--dtype", e.model_dtype]
    if e.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(e.gpu_memory_utilization)]
    if e.kv_events_port is not None:
        # the events say what each engine holds; usage's cached_tokens (only with this flag)
        # says what it hit, so the router's predicted and observed hits can be compared
        args += ["--kv-events-config", events_config(e.kv_events_port),
                 PROMPT_TOKENS_DETAILS]
    args += list(e.engine_args or ())
    kv_config = dict(KV_BOTH)
    if e.kv_buffer_device is not None:
        kv_config["kv_buffer_device"] = e.kv_buffer_device
    doc = stamp(lr.SCHEMA, lr.VERSION, {
        "engine": e.role, "host": plan.host, "runtime": "docker",
        "image": {"ref": e.engine_image, "id": plan.image.get("id"),
                  "repo_digests": list(plan.image.get("repo_digests") or [])},
        "accelerator": plan.accelerator,
        "devices": [{"index": int(g["index"]), "uuid": g["uuid"], "pci_bus_id": g["pci_bus_id"],
                     "render_node": g.get("render_node")} for g in plan.gpus],
        "tensor_parallel_size": plan.tensor_parallel_size, "model_dir": e.model_dir,
        "model_tree_sha256": plan.model.get("model_tree_sha256"),
        "served_model_name": e.model_name, "run_dir": e.run_dir,
        "fabric_interface": e.fabric_interface, "fabric_address": plan.fabric_address,
        "ports": ports(e),
        "kv_transfer_config": kv_config, "environment": env,
        "secret_environment": sorted(secret_names), "vllm_args": args,
    })
    lr.LaunchRecord.model_validate_json(json.dumps(doc))  # the contract every role reads
    return doc


# Where the router host's fleet (runs/<run>/router/fleet.json) finds the key files Gate B
# places in runs/<run>/secrets/ (package/rolefiles.py): the keys never enter the document.
ROUTER_KEY_FILE = "../secrets/NARWHAL_ROUTER_API_KEY"
ENGINE_KEY_FILE = "../secrets/NARWHAL_ENGINE_KEY"
TENANT = "default"


def credentials(inputs: Inputs) -> dict[str, Any]:
    """The fleet's credential sections from the `.env`: the router's tenant key
    (NARWHAL_ROUTER_API_KEY: every client must send it) and the engines' API key
    (NARWHAL_ENGINE_KEY: the router and the preflight tools send it to every engine). The
    operational endpoints stay open to the router host's private path, as without keys:
    Prometheus and the standby beside the router read them."""
    out: dict[str, Any] = {}
    if inputs.router.api_key is not None:
        out["tenants"] = [{"name": TENANT, "key_file": ROUTER_KEY_FILE}]
        out["operations"] = {"open": True}
    if inputs.engine_key is not None:
        out["engine_auth"] = {"key_file": ENGINE_KEY_FILE}
    return out


def events_endpoint(plan: EnginePlan) -> str | None:
    """Where the router host subscribes to the engine's KV events: the host it reaches the
    engine's HTTP at (its URL's, the fabric address by default) and the events port."""
    port = plan.engine.kv_events_port
    if port is None:
        return None
    host = urlsplit(engine_url(plan)).hostname or plan.fabric_address
    return f"tcp://{f'[{host}]' if ':' in host else host}:{port}"


def fleet_engine(plan: EnginePlan) -> dict[str, Any]:
    """One engine of the fleet: id, URL, role, and where it publishes KV events (if it does)."""
    entry: dict[str, Any] = {"id": plan.engine.role, "url": engine_url(plan), "role": "both"}
    endpoint = events_endpoint(plan)
    if endpoint is not None:
        entry["kv_events"] = {"endpoint": endpoint, "topic": EVENTS_TOPIC}
    return entry


def fleet_draft(inputs: Inputs, plans: list[EnginePlan]) -> dict[str, Any]:
    """A `narwhal.fleet` v1 draft: every engine `both` (kv_both) with its KV events endpoint
    when it publishes, the SLO and the credential sections from the inputs. Gate E completes
    it (attestation URLs); the router host reads it after Gate B. Held to core's FleetDocument
    before it is returned, so a draft the router would refuse is never written."""
    return fl.checked_fleet({
        "schema": fl.SCHEMA, "schema_version": fl.VERSION,
        "model": inputs.engines[0].model_name,
        "engines": [fleet_engine(p) for p in plans],
        "slo": {"ttft_s": inputs.ttft_s, "tpot_s": inputs.tpot_s},
        "journal": {"path": "journal.jsonl"},
        **credentials(inputs),
    }, "fleet-draft.json (Gate A, from the .env)")

