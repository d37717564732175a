#!/usr/bin/env python3
"""Gate C on the lab: `narwhal engines` wall time against the slowest engine's start-to-healthy.

    .venv/bin/python bench/engines.py [--runs 3]

Each run brings up a fresh default lab, passes Gates A and B (prepared in the root
namespace, the wheels built once by the first run), then times `narwhal engines` from the
workstation namespace. For each engine, start-to-healthy is the `narwhal-engine start`
command's duration plus the seconds its capture waited for /health; the ratio of the gate's
wall time to the slowest engine's start-to-healthy shows the concurrency (the three lab
engines have disjoint GPUs, so they start at once: a serial gate would sit near the sum).
Needs root. Summary to results/engines-<time>.json. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from _lab_gates import clean_checkout, lab_env, narwhal, pass_gates, write_results

from narwhal.lab import lifecycle, spec


def _start_to_healthy(attempt: Path) -> dict[str, float]:
    starts: dict[str, float] = {}
    for line in (attempt / "commands.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["argv"][0].endswith("/narwhal-engine") and row["argv"][1] == "start":
            starts[row["argv"][3].rsplit("/", 1)[1]] = row["duration_s"]
    out = {}
    for role, start_s in starts.items():
        cap = json.loads((attempt / f"cache-layout-{role}.json").read_text())
        out[role] = round(start_s + cap["healthy_after_s"], 3)
    return out


def _span_and_serial(attempt: Path) -> tuple[float, float, float]:
    """From commands.jsonl: the span from the first command to the last; the slowest engine's
    start + capture; and the sum of every engine's start + capture (what a serial gate
    would spend on them)."""
    rows = [json.loads(line) for line in (attempt / "commands.jsonl").read_text().splitlines()]
    stamps = [datetime.fromisoformat(r[k].replace("Z", "+00:00")).timestamp()
              for r in rows for k in ("start", "end")]
    per: dict[str, float] = {}
    for r in rows:
        if r["argv"][0].endswith("/narwhal-engine") and r["argv"][1] in ("start", "capture"):
            per[r["host"]] = per.get(r["host"], 0.0) + r["duration_s"]
    return max(stamps) - min(stamps), max(per.values()), sum(per.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    lab_spec = spec.load(None)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="narwhal-engines-") as tmp:
        checkout, revision = clean_checkout(Path(tmp) / "checkout")
        runs = Path(tmp) / "runs"
        for k in range(args.runs):
            lifecycle.down(lab_spec.name)
            plan = lifecycle.up(lab_spec)
            try:
                env = lab_env(plan, Path(tmp) / f".env-{k}", f"bench{k}", revision)
                pass_gates(env, runs, checkout, engines=False)
                t0 = time.monotonic()
                done = narwhal(env, runs, "engines", "--json")
                wall = time.monotonic() - t0
                doc = json.loads(done.stdout)
                if doc.get("verdict") != "passed":
                    raise SystemExit(f"bench: engines did not pass: {doc}")
                attempt = runs / f"bench{k}" / "engines" / doc["attempt"]
                each = _start_to_healthy(attempt)
                slowest = max(each.values())
                span, slowest_sc, serial = _span_and_serial(attempt)
                rows.append({"run": k + 1, "wall_s": round(wall, 3), "engines_s": each,
                             "gate_span_s": round(span, 3),
                             "slowest_start_capture_s": round(slowest_sc, 3),
                             "sum_start_capture_s": round(serial, 3),
                             "slowest_start_to_healthy_s": slowest,
                             "sum_start_to_healthy_s": round(sum(each.values()), 3),
                             "ratio": round(wall / slowest, 2)})
                print(f"run {k + 1}: wall {wall:.2f} s, slowest engine start-to-healthy "
                      f"{slowest:.2f} s (x{wall / slowest:.2f}), sum over {len(each)} engines "
                      f"{sum(each.values()):.2f} s; on the hosts: {span:.2f} s from first to "
                      f"last command, start+capture slowest {slowest_sc:.2f} s, summed "
                      f"{serial:.2f} s", flush=True)
            finally:
                lifecycle.down(lab_spec.name)
    summary = {"engines": len(rows[0]["engines_s"]), "runs": len(rows),
               "median_wall_s": statistics.median(r["wall_s"] for r in rows),
               "median_slowest_start_to_healthy_s": statistics.median(
                   r["slowest_start_to_healthy_s"] for r in rows),
               "median_sum_start_to_healthy_s": statistics.median(
                   r["sum_start_to_healthy_s"] for r in rows),
               "median_ratio": statistics.median(r["ratio"] for r in rows),
               "median_gate_span_s": statistics.median(r["gate_span_s"] for r in rows),
               "median_slowest_start_capture_s": statistics.median(
                   r["slowest_start_capture_s"] for r in rows),
               "median_sum_start_capture_s": statistics.median(
                   r["sum_start_capture_s"] for r in rows)}
    write_results("engines", summary, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
