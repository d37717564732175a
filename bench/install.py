#!/usr/bin/env python3
"""Gate B on the lab: `narwhal install` of the 4-host lab from a warm wheelhouse.

    .venv/bin/python bench/install.py [--runs 3]

Each run brings up a fresh default lab (hosts with nothing installed), pins its keys, passes
Gate A, prepares the install in the root namespace (the wheelhouse and the revision's wheels
are built once, by the first run, and reused: "warm"), then times `narwhal install` from the
workstation namespace. From the attempt's commands.jsonl it splits each host's time into pip,
transfer (part file, sha256, link, stat), clone, venv creation, the role commands' --help
and the rest, and reports the slowest host's shares. Target: under 60 s. The revision is a
clean clone of this checkout's HEAD. Needs root. Summary to results/install-<time>.json.
Not part of `make test`.
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

from _lab_gates import clean_checkout, lab_env, narwhal

from narwhal.deploy.hosts import commandline as cl
from narwhal.lab import lifecycle, spec

HERE = Path(__file__).resolve().parent
TRANSFER = {cl.PUT_FILE, cl.STAT_FILE}


def _kind(argv: list[str]) -> str:
    if argv[1:4] == ["-m", "pip", "install"]:
        return "pip"
    script = argv[2] if argv[:2] == ["sh", "-c"] and len(argv) > 2 else None
    if script in TRANSFER or argv[0] in ("sha256sum", "ln") or (
            argv[:2] == ["rm", "-f"] and ".part-" in argv[-1]):
        return "transfer"
    if script == cl.CLONE:
        return "clone"
    if script == cl.VENV_CREATE:
        return "venv"
    if argv[-1:] == ["--help"]:
        return "smoke"
    return "other"


def _split(attempt: Path) -> dict[str, dict[str, float]]:
    hosts: dict[str, dict[str, float]] = {}
    for line in (attempt / "commands.jsonl").read_text().splitlines():
        row = json.loads(line)
        spent = hosts.setdefault(row["host"], {})
        kind = _kind(row["argv"])
        spent[kind] = spent.get(kind, 0.0) + row["duration_s"]
    return hosts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    lab_spec = spec.load(None)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="narwhal-install-") as tmp:
        checkout, revision = clean_checkout(Path(tmp) / "checkout")
        runs = Path(tmp) / "runs"
        common = ["--checkout", str(checkout)]
        for k in range(args.runs):
            lifecycle.down(lab_spec.name)
            plan = lifecycle.up(lab_spec)
            try:
                env = lab_env(plan, Path(tmp) / f".env-{k}", f"bench{k}", revision)
                for step in (["hosts", "trust", "--yes"], ["discover"]):
                    done = narwhal(env, runs, *step)
                    if done.returncode != 0:
                        raise SystemExit(f"bench: {step[0]} failed: {done.stderr[-2000:]}")
                t0 = time.monotonic()
                prepared = narwhal(env, runs, "install", "--prepare-only", *common, lab=False)
                prepare_s = time.monotonic() - t0
                if prepared.returncode != 0:
                    raise SystemExit(f"bench: prepare failed: {prepared.stderr[-2000:]}")
                t0 = time.monotonic()
                done = narwhal(env, runs, "install", "--json", *common)
                wall = time.monotonic() - t0
                doc = json.loads(done.stdout)
                if doc.get("verdict") != "passed":
                    raise SystemExit(f"bench: install did not pass: {doc}")
                attempt = runs / f"bench{k}" / "install" / doc["attempt"]
                split = _split(attempt)
                slowest = max(split, key=lambda h: sum(split[h].values()))
                total = sum(split[slowest].values())
                row = {"run": k + 1, "prepare_s": round(prepare_s, 2), "wall_s": round(wall, 2),
                       "slowest_host": slowest, "slowest_host_s": round(total, 2),
                       "pip_share": round(split[slowest].get("pip", 0) / wall, 3),
                       "transfer_share": round(split[slowest].get("transfer", 0) / wall, 3),
                       "hosts_s": {h: {k2: round(v, 2) for k2, v in s.items()}
                                   for h, s in split.items()}}
                rows.append(row)
                print(f"run {k + 1}: prepare {prepare_s:.1f} s (root namespace), install wall "
                      f"{wall:.1f} s; slowest host {slowest} {total:.1f} s: pip "
                      f"{split[slowest].get('pip', 0):.1f} s, transfer "
                      f"{split[slowest].get('transfer', 0):.1f} s", flush=True)
            finally:
                lifecycle.down(lab_spec.name)
    summary = {"hosts": len(rows[0]["hosts_s"]), "runs": len(rows),
               "median_wall_s": statistics.median(r["wall_s"] for r in rows),
               "median_pip_share": statistics.median(r["pip_share"] for r in rows),
               "median_transfer_share": statistics.median(r["transfer_share"] for r in rows),
               "first_prepare_s": rows[0]["prepare_s"],
               "warm_prepare_s": statistics.median(r["prepare_s"] for r in rows[1:]) if
               len(rows) > 1 else None, "target_s": 60}
    print(json.dumps(summary))
    out = HERE / "results" / f"install-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"summary": summary, "runs": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
