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
from narwhal.core.transfer_path import TransferPath, conflicts

SCHEMA = "narwhal.engine-run-plan"
VERSION = 1
CONTAINER_PREFIX = "narwhal-"


def load_record(path: Path) -> tuple[lr.LaunchRecord, str]:
    data = path.read_bytes()
    return lr.LaunchRecord.model_validate_json(data), sha256_bytes(data)


def container_name(record: lr.LaunchRecord) -> str:
    return f"{CONTAINER_PREFIX}{record.engine}"


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
    if runtime == "native" and record.devices:  # a process sees every GPU unless told
        uuids = ",".join(d.uuid for d in record.devices)
        env["CUDA_VISIBLE_DEVICES" if record.accelerator == "nvidia"
            else "ROCR_VISIBLE_DEVICES"] = uuids
    return env


def device_args(record: lr.LaunchRecord) -> list[str]:
    """How the runtime is given exactly the record's GPUs.

    NVIDIA with docker: `--gpus device=UUID,...` (the NVIDIA container toolkit); with podman:
    one CDI device `nvidia.com/gpu=UUID` each (podman's documented way). AMD with either:
    /dev/kfd, each GPU's render node, and the video group that owns them (ROCm's documented
    container flags); the container sees only the GPUs whose render nodes it was given.
    """
    if record.accelerator == "none":
        return []
    if record.accelerator == "nvidia":
        if record.runtime == "podman":
            return [a for d in record.devices for a in ("--device", f"nvidia.com/gpu={d.uuid}")]
        return ["--gpus", "device=" + ",".join(d.uuid for d in record.devices)]
    args = ["--device", "/dev/kfd"]
    for d in record.devices:
        args += ["--device", str(d.render_node)]
    return [*args, "--group-add", "video"]


def serve_args(record: lr.LaunchRecord) -> list[str]:
    """`vllm serve` arguments: the model path first, the launch record's, the KV connector."""
    return [record.model_dir, *record.vllm_args, "--kv-transfer-config",
            json.dumps(record.kv_transfer_config, sort_keys=True, separators=(",", ":"))]


def transfer_args(path: TransferPath | None) -> list[str]:
    """An RDMA path's device nodes, and the locked memory its registrations need."""
    if path is None or not path.device_nodes:
        return []
    args = [a for node in path.device_nodes for a in ("--device", node)]
    return [*args, "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]


def container_argv(record: lr.LaunchRecord, env: dict[str, str],
                   path: TransferPath | None = None) -> list[str]:
    """`docker|podman run -d ...`: host network (the side channel and UCX bind the fabric
    address), the model read-only at its own path, the run dir, exactly the record's GPUs
    and the transfer path's devices."""
    argv = [record.runtime, "run", "-d", "--name", container_name(record), "--network", "host",
            "--ipc", "host", "--label", f"narwhal.engine={record.engine}",
            "-v", f"{record.model_dir}:{record.model_dir}:ro",
            "-v", f"{record.run_dir}:{record.run_dir}", *device_args(record),
            *transfer_args(path)]
    for name in sorted(env):
        argv += ["-e", f"{name}={env[name]}"]
    for name in record.secret_environment:  # passed through from the runtime's environment
        argv += ["-e", name]
    return [*argv, record.image.id, *serve_args(record)]


def build(record: lr.LaunchRecord, record_sha256: str, runtime: str,
          path: TransferPath | None = None) -> dict[str, Any]:
    """The stamped run plan. runtime: the launch record's container runtime, or `native`;
    path: the KV transfer path Gate C derived (PathRefused when the environment contradicts
    it)."""
    env = environment(record, runtime, path)
    if path is not None:  # the path as the engine takes it: the UCX_TLS it is given
        path = path.model_copy(update={"tls": tuple(env["UCX_TLS"].split(","))})
    argv = (container_argv(record, env, path) if runtime != "native"
            else [*(record.entrypoint or ("vllm", "serve")), *serve_args(record)])
    return stamp(SCHEMA, VERSION, {
        "engine": record.engine, "launch_record_sha256": record_sha256, "runtime": runtime,
        "container_name": container_name(record) if runtime != "native" else None,
        "argv": argv, "environment": env if runtime == "native" else {},
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
        "url": f"http://{_reached_at(record)}:{record.ports.engine}"})


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
