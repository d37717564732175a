"""The default lab fleet: emulated `kv_both` engines on the lab's engine hosts, and its fleet document.

Gate F's tools (narwhal-profile, narwhal-check) run where the router runs, so here they run in
the router host's network namespace, the only place besides the engine hosts that reaches the
engines' management addresses. The engines run the emulator's timing model (not zero-delay),
so the curves a profiler fits and the pace a preflight checks are real measurements.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.lab.hosted_engines import MODEL_NAME, LabEngine, emulators
from narwhal.lab.plan import LabPlan
from narwhal.lab.run import in_netns

# Two engines on each of the two engine hosts: 4 engines, 12 ordered producer->consumer pairs,
# 4 of them inside one host and 8 across the fabric.
DEFAULT_PLACEMENTS: tuple[tuple[str, int], ...] = (("eng1", 8000), ("eng1", 8001),
                                                   ("eng2", 8000), ("eng2", 8001))


def engine_id(engine: LabEngine) -> str:
    """`eng1-8000`: host and port, stable across runs and free of addresses."""
    return f"{engine.host}-{engine.url.rsplit(':', 1)[1]}"


def fleet_document(engines: Sequence[LabEngine], work: Path, **sections: Any) -> dict[str, Any]:
    """A narwhal.fleet v1 document over `engines` (all `both`); `sections` add or replace keys."""
    doc: dict[str, Any] = {
        "schema": "narwhal.fleet", "schema_version": 1, "model": MODEL_NAME,
        "engines": [{"id": engine_id(e), "url": e.url, "role": "both"} for e in engines],
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "journal": {"path": str(work / "journal.jsonl")},
        "profiles": {"path": str(work / "profiles.json")},
    }
    doc.update(sections)
    return doc


@dataclass
class LabFleet:
    plan: LabPlan
    engines: list[LabEngine]
    work: Path
    fleet_path: Path

    def write(self, **sections: Any) -> Path:
        """Rewrite the fleet document with `sections` changed; returns its path."""
        self.fleet_path.write_text(json.dumps(fleet_document(self.engines, self.work, **sections), indent=1))
        return self.fleet_path

    def run(self, module: str, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """`python -m module args...` in the router host's namespace (where Gate F runs)."""
        return subprocess.run(in_netns(self.plan.router().netns, [sys.executable, "-m", module, *args]),
                              capture_output=True, text=True, timeout=timeout, check=False)


@contextlib.contextmanager
def lab_fleet(plan: LabPlan, work: Path, placements: Sequence[tuple[str, int]] = DEFAULT_PLACEMENTS,
              extra_args: Sequence[str] = ()) -> Iterator[LabFleet]:
    """Start the emulated fleet (timing model on) and write its fleet document under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    with emulators(plan, placements, work / "engines", extra_args, zero_delay=False) as engines:
        fleet = LabFleet(plan, engines, work, work / "fleet.json")
        fleet.write()
        yield fleet
