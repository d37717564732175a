"""narwhal-profile against two real vLLM CPU engines: the store is written, bound to the live
processes, with finite fit errors. Small sweeps: a CPU engine prefills slowly."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from narwhal.core.profiles import Generation, load_profiles
from narwhal.serve.engine_client import EngineClient
from tests.fidelity.requests import SERVED_NAME
from tests.real.session import Pair

pytestmark = pytest.mark.timeout(600)
# About 10 s on two pinned CPU cores; the engines' start (about a minute) dominates the test.
SWEEP = ["--prefill-lengths", "16,32,64,128,256,400", "--decode-concurrency", "1,2,4",
         "--decode-contexts", "16,128", "--decode-tokens", "24"]


def _generation(url: str) -> Generation:
    async def go() -> Generation:
        async with aiohttp.ClientSession() as session:
            return await EngineClient("x", url, session).generation()
    return asyncio.run(go())


def test_profiling_two_real_engines_writes_rows_bound_to_their_live_generations(
        pair: Pair, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({
        "schema": "narwhal.fleet", "schema_version": 1, "model": SERVED_NAME,
        "engines": [{"id": "p", "url": pair.prefill.url, "role": "both"},
                    {"id": "d", "url": pair.decode.url, "role": "both"}],
        "slo": {"ttft_s": 5.0, "tpot_s": 1.0}, "journal": {"path": "journal.jsonl"},
        "profiles": {"path": "profiles.json"}}))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "narwhal.serve.profile_cli", "--fleet", str(fleet),
                           *SWEEP], capture_output=True, text=True, timeout=500, check=False)
    elapsed = time.monotonic() - started
    print(f"profiled 2 real engines in {elapsed:.1f} s\n{done.stdout}")
    assert done.returncode == 0, done.stderr[-4000:]
    store = load_profiles(tmp_path / "profiles.json", model=SERVED_NAME, engine_ids=("p", "d"))
    assert [r.engine_id for r in store.profiles] == ["p", "d"]
    for row, engine in zip(store.profiles, pair.engines, strict=True):
        assert row.generation == _generation(engine.url)
        for curve in (row.prefill, row.decode):
            assert math.isfinite(curve.fit_error) and math.isfinite(curve.loo_error)
        assert row.prefill.seconds(128) > 0 and row.decode.step_s(256, 2) > 0
    assert (tmp_path / "profiles.json.samples.jsonl").exists()
