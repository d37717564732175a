"""Gate C's `narwhal-engine` driven on this machine with the native runtime, for the tiers
without hosts: a launch record written the way Gate A writes one, and the subcommands run
as Gate C runs them (prepare, check, start, capture, stop), each answering one result line.

Used by tests/component (the engine emulator as the entrypoint) and tests/real (vLLM CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from narwhal.core import result_line
from narwhal.core.documents import stamp
from narwhal.node import host_probe as hp

KV_BOTH = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


def launch_record(path: Path, name: str, *, entrypoint: Sequence[str], model: Path,
                  served: str, http: int, side: int, attest: int,
                  vllm_args: Sequence[str], environment: dict[str, str],
                  image_id: str = "") -> dict[str, Any]:
    """Write `narwhal.launch-record` v1 for a native CPU engine on loopback; return it.
    image_id: what stands for the image (the interpreter); the entrypoint's first word."""
    doc = stamp("narwhal.launch-record", 1, {
        "engine": name, "host": "localhost", "runtime": "native",
        "entrypoint": list(entrypoint), "image": {"ref": "native", "id": image_id or entrypoint[0]},
        "accelerator": "none", "devices": [], "tensor_parallel_size": 1, "model_dir": str(model),
        "model_tree_sha256": hp.model_facts(str(model), True)["model_tree_sha256"],
        "served_model_name": served, "run_dir": str(path.parent),
        "fabric_interface": "lo", "fabric_address": "127.0.0.1",
        "ports": {"engine": http, "attest": attest, "nixl_side_channel": side,
                  "ucx_tcp": [30000, 30100]},
        "kv_transfer_config": KV_BOTH,
        "environment": {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side), **environment},
        "vllm_args": ["--served-model-name", served, "--host", "127.0.0.1", "--port",
                      str(http), *vllm_args]})
    path.write_text(json.dumps(doc))
    return doc


def engine(sub: str, *args: str, timeout: float = 120) -> result_line.ResultLine:
    """One `narwhal-engine` subcommand's result line."""
    done = subprocess.run([sys.executable, "-m", "narwhal.node.engine_cli", sub, *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    return result_line.parse(done.stdout, f"narwhal-engine {sub}")


def start(record: Path, run_dir: Path, capture_timeout: int = 120) -> dict[str, Any]:
    """prepare, check, start and capture one engine; its cache layout. The caller stops it
    (`engine("stop", "--run-dir", ...)`) even when this fails after start."""
    for sub, args in (("prepare", ("--launch", str(record), "--run-dir", str(run_dir))),
                      ("check", ("--run-dir", str(run_dir))),
                      ("start", ("--run-dir", str(run_dir)))):
        done = engine(sub, *args)
        assert done.ok, (sub, done.error, done.data)
    cap = engine("capture", "--run-dir", str(run_dir), "--timeout", str(capture_timeout),
                 timeout=capture_timeout + 100)
    assert cap.ok, cap.error
    layout: dict[str, Any] = cap.data["cache_layout"]
    return layout
