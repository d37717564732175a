"""The file names a deploy leaves in each gate's first attempt: what the record of a deploy
looks like, compared before and after a change that must not alter it (issue 38's demo
comparison; the names are in tests/lab/deploy_record_files.json, taken from `make demo`
before gates became functions)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

MANIFEST = Path(__file__).with_name("deploy_record_files.json")
STEPS = ("access", "discover", "install", "engines", "fabric", "attest", "preflight", "serve")


def first_attempt_files(deployment: Path, steps: tuple[str, ...] = STEPS) -> dict[str, list[str]]:
    """Step -> the sorted names of the files in its first attempt's folder."""
    out: dict[str, list[str]] = {}
    for step in steps:
        folders = sorted(p for p in (deployment / step).glob("001-*") if p.is_dir())
        if folders:
            # out/ holds each command's output by sequence number: how many depends on polls
            out[step] = sorted(p.name for p in folders[0].iterdir() if p.is_file())
    return out


def first_passed_files(deployment: Path, steps: tuple[str, ...] = STEPS
                       ) -> dict[str, list[str]]:
    """Step -> the sorted file names of its first passed attempt, in the ledger's order.

    The first pass of each gate is a whole run, as a fresh deploy's is; later passes on a lab
    that drills faults may be partial (an install resumed with nothing new to own, a preflight
    that binds saved profiles instead of fitting them), and leave other files by design."""
    doc = json.loads((deployment / "ledger.json").read_text())
    entries = {**doc.get("activities", {}), **doc.get("gates", {})}
    out: dict[str, list[str]] = {}
    for step in steps:
        for attempt in entries.get(step, {}).get("attempts", []):
            folder = deployment / step / attempt
            if json.loads((folder / "attempt.json").read_text()).get("verdict") == "passed":
                out[step] = sorted(p.name for p in folder.iterdir() if p.is_file())
                break
    return out


if __name__ == "__main__":  # python -m tests.lab.record_files RUNS/DEPLOYMENT > manifest
    print(json.dumps(first_attempt_files(Path(sys.argv[1])), indent=1))
