#!/usr/bin/env python3
"""`make demo` timed, and each gate of its `narwhal deploy` split into work and the rest.

    .venv/bin/python bench/deploy.py [--runs 2]

Each run is the demo exactly as `make demo` runs it after bootstrap (`python -m
narwhal.lab.demo`: lab up, deploy until A, the install prepared, deploy B to G, deploy again,
a two-rate trial, status, handoffs, export, lab down), timed from outside. Then, from that
run's record, for every gate attempt: its wall time (attempt.json) and the time some command
was running on a host (the union of commands.jsonl's start..end intervals, hosts in parallel
counted once). A command's interval includes its SSH channel, so "outside" is what the
workstation spent with no command out at all: bookkeeping, evidence, waits and sleeps. The
second deploy (every gate kept) is timed from its output. Needs root. Summary to
results/deploy-<time>.json. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _lab_gates import REPO, write_results

from narwhal.core.gates import GATE_NAMES

KEPT_LINE = re.compile(r"narwhal deploy: gates A\.\.G passed in ([0-9.]+) s; ran nothing")


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _busy_s(commands: Path) -> float:
    """Seconds during which at least one command of the attempt was running."""
    spans = sorted((_stamp(r["start"]), _stamp(r["end"])) for r in (
        json.loads(line) for line in commands.read_text().splitlines()) if r.get("end"))
    busy, edge = 0.0, float("-inf")
    for start, end in spans:
        if end > edge:
            busy += end - max(start, edge)
            edge = end
    return busy


def _gates(record: Path) -> dict[str, dict[str, float]]:
    ledger = json.loads((record / "ledger.json").read_text())
    out = {}
    for gate in GATE_NAMES:
        attempt = record / gate / ledger["gates"][gate]["last"]
        wall = float(json.loads((attempt / "attempt.json").read_text())["duration_s"])
        commands = attempt / "commands.jsonl"
        busy = _busy_s(commands) if commands.exists() else 0.0
        out[gate] = {"wall_s": round(wall, 3), "commands_s": round(busy, 3),
                     "outside_share": round(1 - busy / wall, 3) if wall > 0 else 0.0}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    for k in range(args.runs):
        before = set((REPO / ".demo").glob("*")) if (REPO / ".demo").exists() else set()
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "narwhal.lab.demo"], cwd=REPO,
                              capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        if done.returncode != 0:
            raise SystemExit(f"bench: the demo failed: {done.stdout[-3000:]}{done.stderr[-2000:]}")
        [work] = set((REPO / ".demo").glob("*")) - before
        gates = _gates(work / "runs" / "demo")
        kept = KEPT_LINE.search(done.stdout + done.stderr)
        total = sum(g["wall_s"] for g in gates.values())
        busy = sum(g["commands_s"] for g in gates.values())
        rows.append({"run": k + 1, "demo_wall_s": round(wall, 3), "gates": gates,
                     "gates_wall_s": round(total, 3), "gates_commands_s": round(busy, 3),
                     "gates_outside_share": round(1 - busy / total, 3),
                     "deploy_kept_all_s": float(kept[1]) if kept else None})
        print(f"run {k + 1}: demo {wall:.1f} s; gates A..G {total:.1f} s of which commands on "
              f"hosts {busy:.1f} s (outside {1 - busy / total:.0%}); deploy keeping all "
              f"{kept[1] if kept else '?'} s; " + ", ".join(
                  f"{g} {v['wall_s']:.1f}s/{v['outside_share']:.0%}" for g, v in gates.items()),
              flush=True)
    summary = {
        "runs": len(rows),
        "median_demo_wall_s": statistics.median(r["demo_wall_s"] for r in rows),
        "median_gates_wall_s": statistics.median(r["gates_wall_s"] for r in rows),
        "median_gates_outside_share": statistics.median(r["gates_outside_share"] for r in rows),
        "per_gate_median_wall_s": {g: statistics.median(r["gates"][g]["wall_s"] for r in rows)
                                   for g in GATE_NAMES},
        "per_gate_median_outside_share": {
            g: statistics.median(r["gates"][g]["outside_share"] for r in rows)
            for g in GATE_NAMES},
        "bar_demo_s": 180,
    }
    write_results("deploy", summary, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
