#!/usr/bin/env python3
"""Gate D on the lab: `narwhal fabric` wall time against the sum of its samples' durations.

    .venv/bin/python bench/fabric.py [--runs 3] [--seconds 2]

Brings up the default lab once, passes Gates A, B and C (the engines up, idle), then times
`narwhal fabric --seconds S --omit 0` with every edge resampled, `--runs` times. The samples
are the iperf3 client commands in the attempt's commands.jsonl (their own durations, as the
ledger recorded them); the ratio of the command's wall time to their sum is what the gate
spends beyond measuring: link facts, idle proofs, starting and stopping the test server, the
matrix and heatmap. Needs root. Summary to results/fabric-<time>.json. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _lab_gates import clean_checkout, lab_env, narwhal, pass_gates, write_results

from narwhal.lab import lifecycle, spec


def _sample_seconds(attempt: Path) -> list[float]:
    rows = [json.loads(line) for line in (attempt / "commands.jsonl").read_text().splitlines()]
    return [r["duration_s"] for r in rows if r["argv"][:2] == ["iperf3", "--client"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=int, default=2)
    args = p.parse_args()
    lab_spec = spec.load(None)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="narwhal-fabric-") as tmp:
        checkout, revision = clean_checkout(Path(tmp) / "checkout")
        runs = Path(tmp) / "runs"
        lifecycle.down(lab_spec.name)
        plan = lifecycle.up(lab_spec)
        try:
            env = lab_env(plan, Path(tmp) / ".env", "bench", revision)
            pass_gates(env, runs, checkout, engines=True)
            edges = [f"node-{a}->node-{b}" for a in (1, 2, 3) for b in (1, 2, 3) if a != b]
            for k in range(args.runs):
                t0 = time.monotonic()
                done = narwhal(env, runs, "fabric", "--json", "--seconds", str(args.seconds),
                               "--omit", "0", *[x for e in edges for x in ("--resample", e)])
                wall = time.monotonic() - t0
                doc = json.loads(done.stdout)
                if doc.get("verdict") != "passed":
                    raise SystemExit(f"bench: fabric did not pass: {doc}")
                samples = _sample_seconds(runs / "bench" / "fabric" / doc["attempt"])
                total = sum(samples)
                rows.append({"run": k + 1, "wall_s": round(wall, 3), "edges": len(samples),
                             "sum_samples_s": round(total, 3), "ratio": round(wall / total, 3)})
                print(f"run {k + 1}: wall {wall:.2f} s, {len(samples)} samples summing "
                      f"{total:.2f} s (x{wall / total:.2f})", flush=True)
        finally:
            lifecycle.down(lab_spec.name)
    summary = {"edges": rows[0]["edges"], "seconds_per_sample": args.seconds,
               "runs": len(rows), "median_wall_s": statistics.median(r["wall_s"] for r in rows),
               "median_sum_samples_s": statistics.median(r["sum_samples_s"] for r in rows),
               "median_ratio": statistics.median(r["ratio"] for r in rows)}
    write_results("fabric", summary, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
