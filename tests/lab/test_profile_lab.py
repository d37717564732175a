"""narwhal-profile on the default lab fleet: four emulated engines with the timing model on,
profiled from the router host's namespace, within the two minutes the runbook allows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from narwhal.core.profiles import load_profiles
from narwhal.lab.hosted_engines import MODEL_NAME
from narwhal.lab.lab_fleet import lab_fleet
from narwhal.lab.plan import LabPlan

pytestmark = pytest.mark.timeout(400)
BUDGET_S = 120.0


def test_profiling_the_default_lab_fleet_writes_every_row_within_two_minutes(
        needs_lab: LabPlan, tmp_path: Path) -> None:
    """Gate F profiles each engine once; a sweep that took longer would stall every deploy."""
    with lab_fleet(needs_lab, tmp_path) as fleet:
        started = time.monotonic()
        done = fleet.run("narwhal.serve.profile_cli", "--fleet", str(fleet.fleet_path), "--json")
        elapsed = time.monotonic() - started
        print(f"narwhal-profile on {len(fleet.engines)} lab engines: {elapsed:.1f} s")
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        ids = tuple(e["id"] for e in json.loads(fleet.fleet_path.read_text())["engines"])
        store = load_profiles(tmp_path / "profiles.json", model=MODEL_NAME, engine_ids=ids)
        assert len(store.profiles) == 4 and result["written"] is True
        for row in store.profiles:
            print(row.engine_id, row.prefill.model_dump(), row.decode.model_dump())
            assert row.prefill.fit_error < 0.5 and row.decode.fit_error < 0.5, row
        assert (tmp_path / "profiles.json.samples.jsonl").exists()
        assert elapsed < BUDGET_S, f"profiling took {elapsed:.1f} s (budget {BUDGET_S:.0f} s)"
