#!/usr/bin/env python3
"""The router's CPU per request as the fleet grows: 4, 16, 64 and 128 engines, in memory.

    .venv/bin/python bench/router_scale.py [--engines 4,16,64,128] [--requests 10000]

bench/hot_path.py's in-memory router (real Router objects, engines behind the `Connector`
seam, no syscalls) with N engines, half prefill and half decode, under both placement
policies: least-outstanding (a fleet without profiles) and curve-priced (profiles bound to
every engine). Runs alternate the sizes so drift on this shared host spreads over all of
them; each figure is the median of `--repeats` runs, with its ratio to the smallest size in
the same run. Summary to results/router-scale-<time>.json. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import uvloop
from _lab_gates import write_results
from hot_path import run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="4,16,64,128")
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    sizes = [int(x) for x in args.engines.split(",")]
    got: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for priced in (False, True):
            for n in sizes:
                with tempfile.TemporaryDirectory() as tmp:
                    r = uvloop.run(run(args.requests, args.tokens, 1, Path(tmp), priced, n))
                policy = "curve_priced" if priced else "least_outstanding"
                got.setdefault((policy, n), []).append(r["us_per_request"])
                print(f"{policy} {n} engines: {r['us_per_request']:.1f} us/request", flush=True)
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"engines": sizes, "requests": args.requests,
                               "tokens": args.tokens, "repeats": args.repeats}
    for policy in ("least_outstanding", "curve_priced"):
        base = statistics.median(got[(policy, sizes[0])])
        for n in sizes:
            median = statistics.median(got[(policy, n)])
            rows.append({"policy": policy, "engines": n,
                         "us_per_request_runs": [round(x, 1) for x in got[(policy, n)]],
                         "us_per_request_median": round(median, 1),
                         "ratio_to_smallest": round(median / base, 3)})
        summary[policy] = {str(r["engines"]): r["ratio_to_smallest"] for r in rows
                           if r["policy"] == policy}
    write_results("router-scale", summary, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
