#!/usr/bin/env python3
"""Gate A on the lab: discovery's wall time against the slowest single host's probe time.

    .venv/bin/python bench/discover.py [--runs 5]

Brings the default lab up (4 hosts: a router and three engine hosts), pins the host keys, then
runs `narwhal discover` from the workstation namespace `--runs` times. For each run it reads the
attempt's commands.jsonl: the probe's own duration on every host (`python3 <probe>`), and
reports the command's wall time over the slowest host's probe time (1.0 would mean the hosts
cost nothing beyond the slowest one; a serial discovery would be near the sum over hosts).
Needs root. The summary goes to results/discover-<time>.json. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _lab_gates import last_attempt

from narwhal.lab import envfile, lifecycle, spec

HERE = Path(__file__).resolve().parent
NARWHAL = str(Path(sys.executable).parent / "narwhal")
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _narwhal(env: Path, runs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NARWHAL, "lab", "exec", "--", NARWHAL, *args, "--env", str(env),
                           "--runs", str(runs)], capture_output=True, text=True, check=False)


def _probe_times(attempt: Path) -> dict[str, float]:
    times: dict[str, float] = {}
    for line in (attempt / "commands.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["argv"][:1] == ["python3"]:
            times[row["host"]] = row["duration_s"]
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    lab_spec = spec.load(None)
    lifecycle.down(lab_spec.name)
    plan = lifecycle.up(lab_spec)
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="narwhal-discover-") as tmp:
            env, runs = Path(tmp) / ".env", Path(tmp) / "runs"
            envfile.write(plan, env)
            with env.open("a") as fh:
                fh.write(f"NARWHAL_DEPLOYMENT=bench\nNARWHAL_DEPLOYMENT_REVISION={REVISION}\n")
            if _narwhal(env, runs, "hosts", "trust", "--yes").returncode != 0:
                raise SystemExit("bench: could not pin the lab's host keys")
            for k in range(args.runs):
                t0 = time.monotonic()
                done = _narwhal(env, runs, "discover", "--json")
                wall = time.monotonic() - t0
                doc = json.loads(done.stdout)
                if doc.get("verdict") != "passed":
                    raise SystemExit(f"bench: discovery did not pass: {doc}")
                probes = _probe_times(last_attempt(runs, "bench", "discover"))
                slowest = max(probes.values())
                rows.append({"run": k + 1, "wall_s": round(wall, 3),
                             "slowest_probe_s": round(slowest, 3),
                             "sum_of_probes_s": round(sum(probes.values()), 3),
                             "probes_s": probes, "ratio": round(wall / slowest, 2)})
                print(f"run {k + 1}: wall {wall:.2f} s, slowest host probe {slowest:.2f} s "
                      f"(x{wall / slowest:.2f}), sum over {len(probes)} hosts "
                      f"{sum(probes.values()):.2f} s", flush=True)
    finally:
        lifecycle.down(lab_spec.name)
    summary = {"hosts": len(rows[0]["probes_s"]) if rows else 0,
               "median_wall_s": statistics.median(r["wall_s"] for r in rows),
               "median_slowest_probe_s": statistics.median(r["slowest_probe_s"] for r in rows),
               "median_ratio": statistics.median(r["ratio"] for r in rows),
               "median_sum_of_probes_s": statistics.median(r["sum_of_probes_s"] for r in rows)}
    print(json.dumps(summary))
    out = HERE / "results" / f"discover-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"summary": summary, "runs": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
