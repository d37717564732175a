#!/usr/bin/env python3
"""Router overhead: CPU per request, throughput and added latency of P/D routers, side by side.

    .venv/bin/python bench/router_overhead.py [--engines emulator|stub] [--conc 1,16,64]
        [--duration 8] [--warmup 2] [--repeats 3] [--routers narwhal,vllm-router,...]

Two zero-delay engines (p0 prefill, d0 decode) and the load generator (wrk, one thread) share
the client core; every router is pinned alone to the router core and all routers run over the
same two engines. Each measurement is one wrk run of a 64-word prompt, 16 streamed tokens, at
a fixed concurrency; the router's CPU time (utime+stime of its whole process tree, from /proc)
is read before and after, so CPU per request is exact whatever else the machine does. Runs are
interleaved (repeat, then concurrency, then router in a shuffled order) so drifting foreign load
spreads over all routers alike; medians over repeats are reported, with the CPU that other
processes burned during each run. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _procs import Owned, cpu_seconds, cpu_split, machine_busy, rss_kib, stop_on_sigterm
from _report import summarize, table, verdict
from _targets import Engines, smoke, start_engines, start_router, venv

HERE = Path(__file__).resolve().parent
LUA = HERE / "post_completion.lua"
MAX_TOKENS = 16


def wrk(port: int, conc: int, seconds: float, cpu: str, model: str) -> dict[str, Any]:
    cmd = ["taskset", "-c", cpu, "wrk", "-t1", f"-c{conc}", f"-d{max(1, round(seconds))}s",
           "--timeout", "10s", "-s", str(LUA), f"http://127.0.0.1:{port}/v1/completions"]
    env = {**os.environ, "BENCH_MODEL": model, "BENCH_MAX_TOKENS": str(MAX_TOKENS)}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]))


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(name: str, port: int, tree: list[int], conc: int, args: argparse.Namespace,
            model: str, ours: list[int]) -> dict[str, Any]:
    if args.warmup:
        wrk(port, conc, args.warmup, args.client_cpu, model)
    busy0, _ = machine_busy()
    own0 = cpu_seconds(ours) + _children_cpu()
    user0, sys0 = cpu_split(tree)
    t0 = time.monotonic()
    res = wrk(port, conc, args.duration, args.client_cpu, model)
    wall = time.monotonic() - t0
    user1, sys1 = cpu_split(tree)
    used = (user1 - user0) + (sys1 - sys0)
    busy1, _ = machine_busy()
    own1 = cpu_seconds(ours) + _children_cpu()  # wrk has exited: it is in RUSAGE_CHILDREN
    foreign = max(0.0, (busy1 - busy0) - (own1 - own0))
    n = res["requests"]
    errors = (res["status_errors"] + res["connect_errors"] + res["read_errors"]
              + res["write_errors"] + res["timeouts"])
    return {
        "target": name, "conc": conc, "requests": n,
        "rps": n / (res["duration_us"] / 1e6) if res["duration_us"] else 0.0,
        "p50_ms": res["p50_us"] / 1000, "p90_ms": res["p90_us"] / 1000,
        "p99_ms": res["p99_us"] / 1000, "max_ms": res["max_us"] / 1000,
        "cpu_s": round(used, 3),
        "cpu_us_per_req": (used / n * 1e6) if (n and name != "direct") else None,
        "sys_us_per_req": ((sys1 - sys0) / n * 1e6) if (n and name != "direct") else None,
        "errors": errors, "wall_s": round(wall, 2),
        "foreign_pct": round(100 * foreign / (wall * (os.cpu_count() or 1)), 1),
        "loadavg": os.getloadavg()[0],
    }


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", choices=("emulator", "stub"), default="emulator")
    ap.add_argument("--routers", default="narwhal,narwhal-tokenize,vllm-router,narwhal-inference,floor,direct")
    ap.add_argument("--conc", default="1,16,64")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--router-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, journals)")
    return ap.parse_args()


def main() -> int:
    args = _args()
    stop_on_sigterm()
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            print(f"router_overhead: {tool} is not installed (scripts/apt-packages.txt)", file=sys.stderr)
            return 2
    work = Path(tempfile.mkdtemp(prefix="nw-overhead-"))
    names = [n for n in args.routers.split(",") if n]
    concs = [int(c) for c in args.conc.split(",")]
    owned: list[Owned] = []
    rows: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    try:
        stub_py = venv("setup-narwhal-inference.sh") / "bin" / "python" if args.engines == "stub" else None
        engines: Engines = start_engines(args.engines, args.client_cpu, work, stub_py)
        owned += [engines.prefill, engines.decode]
        targets: dict[str, tuple[int, list[int]]] = {}
        for name in names:
            if name == "direct":
                targets[name] = (engines.decode.port, engines.decode.tree())
                continue
            router = start_router(name, engines, args.router_cpu, work)
            owned.append(router)
            smoke(router.port, engines.model, MAX_TOKENS)
            targets[name] = (router.port, router.tree())
            print(f"{name}: ready in {router.extra.get('ready_s')} s, pid {router.pid}, "
                  f"RSS {rss_kib(router.tree()) // 1024} MiB", flush=True)
        ours = [p for o in owned for p in o.tree()]
        rng = random.Random(args.seed)
        for rep in range(1, args.repeats + 1):
            for conc in concs:
                order = list(targets)
                rng.shuffle(order)
                for name in order:
                    port, tree = targets[name]
                    row = measure(name, port, tree, conc, args, engines.model, ours)
                    row["rep"] = rep
                    rows.append(row)
                    cpu = row["cpu_us_per_req"]
                    print(f"rep {rep} c={conc:<3} {name:<18} {row['rps']:7.0f} req/s  "
                          f"p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:8.2f} ms  "
                          f"cpu/req {'-' if cpu is None else f'{cpu:.0f} us'}  "
                          f"errors {row['errors']}  foreign {row['foreign_pct']}%", flush=True)
    finally:
        for o in reversed(owned):
            o.stop()
        failed = any(row["errors"] for row in rows)
        if failed:  # the routers' logs and journals say why; keep them
            print(f"router_overhead: some runs had errors; scratch kept in {work}", flush=True)
        if not args.keep and not failed:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarize(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.replace(":", "")
    report = {"schema": "narwhal.bench.router_overhead", "schema_version": 1, "started": started,
              "engines": args.engines, "max_tokens": MAX_TOKENS, "duration_s": args.duration,
              "repeats": args.repeats, "router_cpu": args.router_cpu,
              "client_cpu": args.client_cpu, "runs": rows, "summary": summary}
    path = args.out / f"router-overhead-{stamp}.json"
    path.write_text(json.dumps(report, indent=1))
    print()
    print(table(summary))
    print()
    for line in verdict(summary):
        print(line)
    print(f"\nwrote {path}" + (f"; scratch kept in {work}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
