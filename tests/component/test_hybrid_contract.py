"""A hybrid (GDN) fleet configured as vLLM documents it, through Gate C's own path: two
emulators started by `narwhal-engine` from launch records whose environment holds
VLLM_SSM_CONV_STATE_LAYOUT=DS (NIXL's requirement) and VLLM_KV_CACHE_LAYOUT=NHD, captured,
and held to core/kv's prediction of the same records. The engines run what their environment
says; so must the prediction, or every hybrid fleet fails its contract."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from narwhal.core.cache_layout import CacheLayout, parse_cache_layout
from narwhal.core.documents import sha256_bytes
from narwhal.core.kv.capture.contract import (
    capture_findings,
    engine_findings,
    pair_problems,
    predicted,
)
from narwhal.core.kv.pair import check_pair
from narwhal.core.launch_record import LaunchRecord
from narwhal.lab.engine.testing import (
    TINY_QWEN3_NEXT,
    EngineStartFailed,
    free_port,
    start_engine,
    write_model_dir,
)
from tests.native_engine import engine, launch_record, start

pytestmark = pytest.mark.timeout(240)
ENTRYPOINT = [sys.executable, "-m", "narwhal.lab.engine", "serve"]
ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "64M"]
HYBRID_ENV = {"VLLM_SSM_CONV_STATE_LAYOUT": "DS", "VLLM_KV_CACHE_LAYOUT": "NHD"}


@dataclass(frozen=True)
class Captured:
    """One engine as the contract gate sees it: its launch record and Gate C's capture."""

    record: LaunchRecord
    record_sha256: str
    layout: CacheLayout


def _model(root: Path) -> Path:
    return write_model_dir(root / "tiny-qwen3-next", TINY_QWEN3_NEXT,
                           {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Captured]]:
    root = tmp_path_factory.mktemp("hybrid")
    model = _model(root)
    out: dict[str, Captured] = {}
    run_dirs = []
    try:
        for name in ("p", "d"):
            path = root / f"{name}.json"
            launch_record(path, name, entrypoint=ENTRYPOINT, model=model, served="tiny",
                          http=free_port(), side=free_port(), attest=free_port(),
                          vllm_args=ARGS, environment=HYBRID_ENV)
            run_dirs.append(root / name)
            layout = parse_cache_layout(start(path, root / name), f"{name} capture")
            data = path.read_bytes()
            out[name] = Captured(LaunchRecord.model_validate_json(data), sha256_bytes(data),
                                 layout)
        yield out
    finally:
        for run_dir in run_dirs:
            engine("stop", "--run-dir", str(run_dir))


def _without_hybrid_env(record: LaunchRecord) -> LaunchRecord:
    """The same record as a prediction from argv alone saw it."""
    env = {k: v for k, v in record.environment.items() if k not in HYBRID_ENV}
    return record.model_copy(update={"environment": env})


def test_each_hybrid_engine_is_what_its_launch_record_predicts(
        fleet: dict[str, Captured]) -> None:
    for name, c in fleet.items():
        geometry = predicted(name, c.record, c.layout)
        assert geometry.has_mamba and geometry.plan.ssm_conv_state_layout == "DS"
        assert geometry.kv_cache_layout == "LBNHC"  # NHD, as the engine's environment says
        assert c.layout.ranks[0].metadata.kv_cache_layout == "LBNHC"  # and as it runs
        problems = (capture_findings(name, c.record_sha256, c.layout)
                    + engine_findings(name, geometry, c.layout))
        assert problems == [], [p.line() for p in problems]


def test_the_hybrid_pair_passes_the_pair_rules_both_ways(fleet: dict[str, Captured]) -> None:
    p = predicted("p", fleet["p"].record, fleet["p"].layout)
    d = predicted("d", fleet["d"].record, fleet["d"].layout)
    assert pair_problems(check_pair(p, d)) == pair_problems(check_pair(d, p)) == []


def test_a_prediction_blind_to_the_environment_fails_the_same_engines(
        fleet: dict[str, Captured]) -> None:
    """What the gate said before it read the environment: the live layout and the conv
    state orientation both contradict it."""
    blind = {n: predicted(n, _without_hybrid_env(c.record), c.layout) for n, c in fleet.items()}
    lines = [p.line() for p in engine_findings("p", blind["p"], fleet["p"].layout)]
    assert any("kv_cache_layout" in line for line in lines), lines
    fields = [p.field for p in pair_problems(check_pair(blind["p"], blind["d"]))]
    assert "p -> d: VLLM_SSM_CONV_STATE_LAYOUT" in fields, fields


def test_an_emulator_with_an_invalid_conv_state_layout_refuses_to_start(
        tmp_path: Path) -> None:
    """The emulator reads its environment through core/kv too, and names the variable."""
    with pytest.raises(EngineStartFailed) as info:
        start_engine(_model(tmp_path), log_path=tmp_path / "bad.log",
                     extra_args=ARGS, env={"VLLM_SSM_CONV_STATE_LAYOUT": "XY"})
    assert "VLLM_SSM_CONV_STATE_LAYOUT" in str(info.value)
    assert "SD, DS" in str(info.value)

