"""A launch record (Gate A) made concrete for one host: the run plan, written as launch.json.

The plan names everything the start will do, so `check` can test it against the host and
`start` can refuse a plan that changed since: the runtime's full argv (image by Id, never by
tag), the devices, the environment (secret names only; their values are read from 0600
files at start and passed through the runtime's environment, never its argv), the ports, the
NIXL side channel and UCX settings, and the URL the engine will answer on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from narwhal.core import launch_record as lr
from narwhal.core.documents import canonical_json, sha256_bytes, stamp
from narwhal.core.run_plan import SCHEMA, VERSION, checked_plan
from narwhal.core.transfer_path import TransferPath, conflicts
from narwhal.node.engine import runtimes
from narwhal.node.engine.runtimes.container import CONTAINER_PREFIX, container_name

__all__ = ["CONTAINER_PREFIX", "container_name"]


def load_record(path: Path) -> tuple[lr.LaunchRecord, str]:
    data = path.read_bytes()
    return lr.LaunchRecord.model_validate_json(data), sha256_bytes(data)


class PathRefused(ValueError):
    """The launch environment would move the KV another way than the path Gate D measures."""


def environment(record: lr.LaunchRecord, runtime: str,
                path: TransferPath | None = None) -> dict[str, str]:
    """The engine's environment: the launch record's, the UCX port range, and the transfer
    path's UCX_TLS and UCX_NET_DEVICES (without a path, the fabric interface alone)."""
    env = dict(record.environment)
    low, high = record.ports.ucx_tcp
    env.setdefault("UCX_TCP_PORT_RANGE", f"{low}-{high}")
    if path is not None:
        clash = conflicts(path, env)
        if clash:
            raise PathRefused(f"the launch environment sets {'; '.join(clash)}: remove it from "
                              "NARWHAL_ENGINE_ENV (the transport settings choose the path, "
                              "and Gate D measures that one)")
        for name, value in path.environment().items():
            env.setdefault(name, value)  # an operator's UCX_TLS may add copy transports
    env.setdefault("UCX_NET_DEVICES", record.fabric_interface)
    env.update(runtimes.choose(runtime).visible_devices(record))
    return env


def serve_args(record: lr.LaunchRecord) -> list[str]:
    """`vllm serve` arguments: the model path first, the launch record's, the KV connector."""
    return [record.model_dir, *record.vllm_args, "--kv-transfer-config",
            json.dumps(record.kv_transfer_config, sort_keys=True, separators=(",", ":"))]


def build(record: lr.LaunchRecord, record_sha256: str, runtime: str,
          path: TransferPath | None = None) -> dict[str, Any]:
    """The stamped run plan. runtime: the launch record's container runtime, or `native`;
    path: the KV transfer path Gate C derived (PathRefused when the environment contradicts
    it)."""
    chosen = runtimes.choose(runtime)
    env = environment(record, runtime, path)
    if path is not None:  # the path as the engine takes it: the UCX_TLS it is given
        path = path.model_copy(update={"tls": tuple(env["UCX_TLS"].split(","))})
    # a container's argv is built by the launch record's own runtime (its binary and flags)
    builder = runtimes.container_for(record.runtime) if chosen.contained else chosen
    argv = builder.launch_argv(record, env, path, serve_args(record))
    return checked_plan(stamp(SCHEMA, VERSION, {
        "engine": record.engine, "launch_record_sha256": record_sha256, "runtime": runtime,
        "container_name": chosen.container_name(record),
        "argv": argv, "environment": chosen.plan_environment(env),
        "secret_environment": list(record.secret_environment),
        "image_id": record.image.id, "accelerator": record.accelerator,
        "devices": [d.model_dump() for d in record.devices],
        "tensor_parallel_size": record.tensor_parallel_size, "model_dir": record.model_dir,
        "model_tree_sha256": record.model_tree_sha256, "run_dir": record.run_dir,
        "served_model_name": record.served_model_name, "vllm_args": list(record.vllm_args),
        "fabric_interface": record.fabric_interface, "fabric_address": record.fabric_address,
        "ports": record.ports.model_dump(exclude_none=True),
        "side_channel": {"host": env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", record.fabric_address),
                         "port": record.ports.nixl_side_channel},
        "transfer": path.model_dump(mode="json") if path is not None else None,
        "url": f"http://{_reached_at(record)}:{record.ports.engine}"}), record.engine)


def _reached_at(record: lr.LaunchRecord) -> str:
    """Where the engine host's own tools reach the engine: the address it binds (--host), or
    loopback when it binds every interface."""
    args = list(record.vllm_args)
    host = "127.0.0.1"
    for i, a in enumerate(args):
        if a == "--host" and i + 1 < len(args):
            host = args[i + 1]
        elif a.startswith("--host="):
            host = a.split("=", 1)[1]
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - recognising the wildcard
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def plan_bytes(plan: dict[str, Any]) -> bytes:
    return canonical_json(plan).encode() + b"\n"
