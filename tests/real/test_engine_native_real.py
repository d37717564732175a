"""Gate C's `narwhal-engine` with the native runtime on two real vLLM CPU engines.

Each engine is started from a launch record through prepare, check, start and capture, the
way Gate C runs them on a host, then its captured layout is held to core/kv's prediction
for that launch record: the compatibility hash and side-channel metadata of its rank, and
the pair between the two engines. Then narwhal-check's contract gate reads the same
captures, as the router host does in preflight, and passes both engines and both pairs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from narwhal.core.kv.pair import check_pair
from tests.component.preflight.check_fleet import run_check
from tests.fidelity.requests import SERVED_NAME
from tests.native_engine import engine, launch_record, start
from tests.real.engines import KV_CACHE_MEMORY_BYTES, MAX_MODEL_LEN, free_port
from tests.real.prediction import assert_capture_is_predicted


def _record(path: Path, name: str, core: int, python: Path, model: Path) -> dict[str, Any]:
    side = free_port()
    return launch_record(
        path, name, model=model, served=SERVED_NAME, http=free_port(), side=side,
        attest=free_port(), image_id=str(python),
        entrypoint=["taskset", "-c", str(core), str(python), "-m",
                    "vllm.entrypoints.openai.api_server", "--model"],
        environment={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "VLLM_CPU_OMP_THREADS_BIND": str(core), "UCX_TLS": "tcp,self",
                     "UCX_NET_DEVICES": "lo", "VLLM_HOST_IP": "127.0.0.1",
                     "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"},
        vllm_args=["--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32",
                   "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
                   "--attention-backend", "CPU_ATTN"])


def test_native_engines_start_from_launch_records_and_match_the_prediction(
        real_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    runs: list[Path] = []
    geometries = []
    captures = tmp_path / "captures"
    captures.mkdir()
    try:
        for name, core in (("native-p", 0), ("native-d", 1)):
            run_dir = tmp_path / name
            record = _record(tmp_path / f"{name}.json", name, core, real_python, tiny_model)
            runs.append(run_dir)
            layout = start(tmp_path / f"{name}.json", run_dir, capture_timeout=300)
            assert layout["started"]["runtime"] == "native"
            geometry = assert_capture_is_predicted(layout, record, name)
            assert layout["completion"]["text"] and SERVED_NAME in layout["models"]
            geometries.append(geometry)
            shutil.copy(tmp_path / f"{name}.json", captures / f"launch-{name}.json")
            (captures / f"cache-layout-{name}.json").write_text(json.dumps(layout))
        assert check_pair(geometries[0], geometries[1]).compatible
        assert check_pair(geometries[1], geometries[0]).compatible

        fleet = tmp_path / "fleet.json"
        fleet.write_text(json.dumps({
            "schema": "narwhal.fleet", "schema_version": 1, "model": SERVED_NAME,
            "engines": [{"id": g.engine, "url": f"http://127.0.0.1:{_port(tmp_path, g.engine)}",
                         "role": "both"} for g in geometries],
            "slo": {"ttft_s": 5.0, "tpot_s": 1.0}, "journal": {"path": "journal.jsonl"}}))
        run = run_check(fleet, "--captures", str(captures), "--only", "contract")
        assert run.code == 0, run.failures()
        contract = run.verdicts("contract")
        assert set(contract) == {"native-p", "native-d", "native-p->native-d",
                                 "native-d->native-p"}
        assert all(v["status"] == "pass" for v in contract.values()), contract
        assert contract["native-p"]["values"]["compatibility_hash"] == \
            geometries[0].compatibility_hash
    finally:
        for run_dir in runs:
            engine("stop", "--run-dir", str(run_dir))


def _port(root: Path, name: str) -> int:
    record = json.loads((root / f"{name}.json").read_text())
    return int(record["ports"]["engine"])
