"""The emulator is light: idle RSS, start-up time, and eight engines under 1 GiB together."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from narwhal.lab.engine.testing import RunningEngine, start_engine, write_llama3_8b
from tests.component.engine.client import post
from tests.component.engine.conftest import StartEngine

pytestmark = pytest.mark.timeout(180)
RSS_LIMIT = 90 * 2**20
FLEET_LIMIT = 2**30


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_one_idle_emulator_is_small_and_starts_fast(tiny_model: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    began = time.monotonic()
    engine = start_engine(tiny_model, log_path=tmp_path / "engine.log")
    took = time.monotonic() - began
    try:
        assert post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 4}).status == 200
        resident = rss(engine.pid)
    finally:
        engine.stop()
    with capsys.disabled():
        print(f"\n[emulator] idle RSS {resident / 2**20:.1f} MiB, healthy after {took:.2f} s")
    assert resident < RSS_LIMIT
    assert took < 10.0


def test_eight_engines_with_a_llama_8b_plan_fit_in_1_gib(engines: StartEngine, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    model = write_llama3_8b(tmp_path / "llama-3-8b")
    fleet: list[RunningEngine] = [engines("--emu-zero-delay", "--max-model-len", "8192",
                                          model=model) for _ in range(8)]
    for engine in fleet:
        reply = post(engine, "/v1/completions", {"prompt": "the world", "max_tokens": 8})
        assert reply.status == 200
    total = sum(rss(e.pid) for e in fleet)
    with capsys.disabled():
        print(f"\n[emulator] 8 engines: {total / 2**20:.1f} MiB RSS in total")
    assert total < FLEET_LIMIT
