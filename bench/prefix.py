#!/usr/bin/env python3
"""Cache-aware P/D routing on repeating traffic: every router over the same emulators, one run.

    .venv/bin/python bench/prefix.py --workload mooncake|chat [--rate 16] [--seconds 60]
        [--routers narwhal-blind,narwhal,vllm-router,sglang-router,narwhal-inference]
        [--ttft 0.5] [--tpot 0.05] [--cache-blocks N] [--seed 0]

Four kv_both emulators (2 prefill + 2 decode, the goodput bench's fleet) with prefix caching
on, a bounded cache per engine (`--cache-blocks` blocks of 16 tokens: the schedule's blocks do
not fit in one engine) and vLLM's ZMQ KV events published per engine. Prefill is dearer per
token than in the goodput bench (0.2 ms a token, Timing.prefill_b), standing in for the long
prompts the scaled-down trace came from, so a cache hit saves real prefill time and a router
that spreads a conversation over both prefill engines pays for it in TTFT.

Workloads (bench/_traces.py): `mooncake`, the Mooncake FAST'25 conversation trace (its first
1200 requests, bench/traces/) with each 512-token hash block scaled to 16 tokens, in its own
order and relative timing, time-scaled to `--rate`; `chat`, seeded tenants with shared system
prompts and users whose every turn resends the conversation so far. Each router gets the same
fixed schedule (open loop, arrival times decided in advance), the same client (aiohttp on one
core, every request streamed), and engines whose prefix caches were reset (POST
/reset_prefix_cache) after the router started and before the first request, so every row
starts cold. Per row: goodput (requests that answered 200, streamed every token, TTFT <=
--ttft and mean TPOT <= --tpot, per second of offered schedule), TTFT p50/p99, mean-TPOT p50,
and the engines' own prefix-cache hit rate (vllm:prefix_cache_hits_total over the queries of
prompts an engine computed itself, i.e. less vllm:external_prefix_cache_queries_total, the
decode legs whose KV came from a prefill engine), beside the schedule's reuse ceiling (every
repeated full block hit, infinite cache) and an LRU simulation of round robin and
longest-prefix placement at this cache size. A router that fails to start is recorded with its
log tail and skipped. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _traces as traces
import aiohttp
from _goodput_fleet import CacheSetup, Fleet, Timing, start_fleet
from _prefix_routers import DEFAULT_ROUTERS, ROUTERS, log_tail, start_prefix_router
from _procs import Owned, http_status, stop_on_sigterm
from goodput import attains

HERE = Path(__file__).resolve().parent
BLOCK = 16  # engine --block-size; one Mooncake hash block becomes one engine block
TIMING = Timing(prefill_b=2.0e-4)  # prefill 1k tokens ~ 0.21 s: hits save real time
CACHE_BLOCKS = {"mooncake": 4096, "chat": 512}  # per engine; see README, bench/prefix.py
METRICS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
           "vllm:external_prefix_cache_queries_total")


def engine_counters(port: int) -> dict[str, float]:
    """The prefix-cache counters of one engine's /metrics (summed over label sets)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=10) as reply:
        text = reply.read().decode()
    out = dict.fromkeys(METRICS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def hit_rate(before: list[dict[str, float]], after: list[dict[str, float]],
             roles: list[str]) -> dict[str, Any]:
    """Engine-reported hits over the prompt tokens engines computed themselves, per engine and
    overall: the share of prefill work the caches saved."""
    per: dict[str, Any] = {}
    hits = local = 0.0
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        h = a[METRICS[0]] - b[METRICS[0]]
        q = (a[METRICS[1]] - b[METRICS[1]]) - (a[METRICS[2]] - b[METRICS[2]])
        per[f"e{i}"] = {"role": roles[i], "hit_tokens": int(h), "computed_prompt_tokens": int(q)}
        hits += h
        local += q
    return {"hit_rate": round(hits / local, 4) if local else None, "engines": per}


def reset_caches(fleet: Fleet) -> None:
    """Every engine's prefix cache emptied (VLLM_SERVER_DEV_MODE route), so a row starts cold."""
    for eng in fleet.engines:
        status, body = http_status(eng.port, "/reset_prefix_cache", "POST", b"")
        if status != 200:
            raise RuntimeError(f"reset_prefix_cache on :{eng.port}: {status} {body[:200]!r}")


def _body(model: str, req: traces.Request) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": model, "max_tokens": req.max_tokens, "stream": True,
                            "temperature": 0}
    if req.messages is not None:
        body["messages"] = list(req.messages)
        return "/v1/chat/completions", body
    body["prompt"] = req.prompt
    return "/v1/completions", body


def _has_token(event: dict[str, Any]) -> bool:
    for choice in event.get("choices", []):
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def _stream(resp: aiohttp.ClientResponse, row: dict[str, Any]) -> tuple[float, float]:
    first = last = 0.0
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        if not _has_token(json.loads(line[6:])):
            continue
        last = time.monotonic()
        if row["tokens"] == 0:
            first = last
        row["tokens"] += 1
    return first, last


async def one(session: aiohttp.ClientSession, base: str, model: str, req: traces.Request,
              t_zero: float, timeout_s: float) -> dict[str, Any]:
    """One scheduled request, streamed: status, tokens, TTFT and mean TPOT as the client saw."""
    await asyncio.sleep(max(0.0, t_zero + req.at - time.monotonic()))
    sent = time.monotonic()
    row: dict[str, Any] = {"at": req.at, "max_tokens": req.max_tokens, "status": 0,
                           "tokens": 0, "ttft_s": None, "tpot_s": None}
    path, body = _body(model, req)
    try:
        async with session.post(base + path, json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            row["status"] = resp.status
            if resp.status != 200:
                row["error"] = (await resp.read())[:120].decode(errors="replace")
                return row
            first, last = await _stream(resp, row)
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        row["error"] = type(exc).__name__
        return row
    if row["tokens"]:
        row["ttft_s"] = first - sent
        if row["tokens"] > 1:
            row["tpot_s"] = (last - first) / (row["tokens"] - 1)
    return row


async def replay(port: int, model: str, schedule: list[traces.Request],
                 timeout_s: float) -> list[dict[str, Any]]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        t_zero = time.monotonic() + 0.5
        return list(await asyncio.gather(*[
            one(session, f"http://127.0.0.1:{port}", model, r, t_zero, timeout_s)
            for r in schedule]))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))], 4)


def score(rows: list[dict[str, Any]], seconds: float, ttft: float,
          tpot: float) -> dict[str, Any]:
    good = [r for r in rows if attains(r, ttft, tpot)]
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    tpots = [r["tpot_s"] for r in rows if r["tpot_s"] is not None]
    errors: dict[str, int] = {}
    for r in rows:
        if r["status"] != 200 or "error" in r:
            key = f"{r['status']} {str(r.get('error', ''))[:60]}".strip()
            errors[key] = errors.get(key, 0) + 1
    return {"offered": len(rows), "offered_rps": round(len(rows) / seconds, 3),
            "ok_200": sum(r["status"] == 200 for r in rows), "attaining": len(good),
            "attainment": round(len(good) / len(rows), 4) if rows else None,
            "goodput_rps": round(len(good) / seconds, 3),
            "ttft_p50_s": _pct(ttfts, 0.5), "ttft_p99_s": _pct(ttfts, 0.99),
            "tpot_p50_s": _pct(tpots, 0.5),
            "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5])}


def run_row(name: str, fleet: Fleet, schedule: list[traces.Request], args: argparse.Namespace,
            work: Path, owned: list[Owned]) -> dict[str, Any]:
    """Start one router, reset the caches, replay the schedule, read the engines' counters."""
    slo = {"ttft_s": args.ttft, "tpot_s": args.tpot}
    try:
        router = start_prefix_router(name, fleet, TIMING, slo, args.router_cpu, work)
    except Exception as exc:  # a router that cannot start is a result, not a crash
        print(f"{name}: did not start: {exc}", flush=True)
        return {"started": False, "error": str(exc)[:400],
                "log_tail": log_tail(work / f"{name}.log")}
    owned.append(router)
    try:
        time.sleep(1.0)  # let subscribers (KV events) connect before the reset they must see
        reset_caches(fleet)
        before = [engine_counters(e.port) for e in fleet.engines]
        t0 = time.monotonic()
        rows = asyncio.run(replay(router.port, fleet.model, schedule, args.timeout))
        wall = time.monotonic() - t0
        after = [engine_counters(e.port) for e in fleet.engines]
        res = {"started": True, "ready_s": router.extra.get("ready_s"),
               **score(rows, args.seconds, args.ttft, args.tpot),
               "engine_cache": hit_rate(before, after, fleet.roles), "wall_s": round(wall, 1)}
        if router.proc.poll() is not None:
            res["exited"] = router.proc.returncode
            res["log_tail"] = log_tail(router.log)
        return res
    finally:
        router.stop()
        owned.remove(router)
        time.sleep(3.0)  # engines drain whatever a timed-out client left behind


def build_schedule(args: argparse.Namespace, vocab: traces.Vocab) -> list[traces.Request]:
    if args.workload == "mooncake":
        rows = traces.load_mooncake(args.trace_file)
        return traces.mooncake_schedule(vocab, rows, args.rate, args.seconds, BLOCK,
                                        args.max_blocks, args.max_output, args.seed)
    return traces.chat_schedule(vocab, args.rate, args.seconds, args.seed)


def workload_facts(schedule: list[traces.Request], vocab: traces.Vocab,
                   cache_blocks: int) -> dict[str, Any]:
    """What the schedule offers and how much of it can be reused: the ceiling and what LRU
    caches of this size would hit under round robin and longest-prefix placement."""
    ids = [vocab.token_ids(r) for r in schedule]
    return {**traces.describe(schedule, [len(i) for i in ids]),
            "reuse": traces.reuse_ceiling(ids, BLOCK),
            "lru_reference": traces.lru_hit_rates(ids, BLOCK, cache_blocks, engines=2)}


def table(results: dict[str, dict[str, Any]], ceiling: float | None) -> str:
    head = (f"{'router':<20}{'offered':>8}{'ok':>6}{'goodput/s':>10}{'attain':>8}"
            f"{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}{'hit rate':>10}{'ceiling':>9}")
    lines = [head]
    for name, r in results.items():
        if not r.get("started"):
            lines.append(f"{name:<20}  did not start: {str(r.get('error'))[:70]}")
            continue

        def f(v: float | None, fmt: str = ".3f") -> str:
            return "-" if v is None else format(v, fmt)

        lines.append(
            f"{name:<20}{r['offered']:>8}{r['ok_200']:>6}{r['goodput_rps']:>10.2f}"
            f"{100 * (r['attainment'] or 0):>7.1f}%{f(r['ttft_p50_s']):>10}"
            f"{f(r['ttft_p99_s']):>10}{f(r['tpot_p50_s'], '.4f'):>10}"
            f"{f(r['engine_cache']['hit_rate']):>10}{f(ceiling):>9}")
    return "\n".join(lines)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("mooncake", "chat"), default="mooncake")
    ap.add_argument("--rate", type=float, default=16.0, help="offered requests/s (mean)")
    ap.add_argument("--seconds", type=float, default=60.0, help="schedule length")
    ap.add_argument("--routers", default=",".join(DEFAULT_ROUTERS))
    ap.add_argument("--ttft", type=float, default=0.5, help="SLO: seconds to first token")
    ap.add_argument("--tpot", type=float, default=0.05, help="SLO: mean seconds per output token")
    ap.add_argument("--cache-blocks", type=int, default=0,
                    help="prefix cache per engine in 16-token blocks (0: the workload's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace-file", type=Path, default=traces.MOONCAKE,
                    help="a Mooncake-format JSONL (default: the committed 1200-request subset)")
    ap.add_argument("--max-blocks", type=int, default=120, help="mooncake: blocks per prompt cap")
    ap.add_argument("--max-output", type=int, default=32, help="mooncake: output tokens cap")
    ap.add_argument("--router-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--engine-cpu", default="0-1")
    ap.add_argument("--timeout", type=float, default=60.0, help="per request, seconds")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (logs)")
    args = ap.parse_args()
    bad = [n for n in args.routers.split(",") if n not in ROUTERS]
    if bad or not args.routers:
        ap.error(f"--routers: unknown {bad}; choose from {', '.join(ROUTERS)}")
    if not 3.0 <= args.seconds <= 3600 or args.rate <= 0 or args.ttft <= 0 or args.tpot <= 0:
        ap.error("--seconds must be 3..3600; --rate, --ttft, --tpot positive")
    if not 0 < args.max_blocks * BLOCK + args.max_output <= 2048:
        ap.error("--max-blocks * 16 + --max-output must fit the model's 2048 tokens")
    args.cache_blocks = args.cache_blocks or CACHE_BLOCKS[args.workload]
    if args.cache_blocks < 2048 // BLOCK:
        ap.error("--cache-blocks must hold one 2048-token request (>= 128)")
    return args


def _run(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fleet, the schedule and every row; the engines are stopped on the way out."""
    owned: list[Owned] = []
    results: dict[str, Any] = {}
    try:
        fleet = start_fleet(4, TIMING, args.engine_cpu, work, CacheSetup(args.cache_blocks))
        owned += fleet.engines
        assert fleet.model_dir is not None
        vocab = traces.Vocab(fleet.model_dir)
        schedule = build_schedule(args, vocab)
        facts = workload_facts(schedule, vocab, args.cache_blocks)
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
        print(f"{args.workload}: {len(schedule)} requests over {args.seconds:.0f} s, reuse "
              f"ceiling {facts['reuse']['ceiling']}, LRU reference {facts['lru_reference']}",
              flush=True)
        for name in args.routers.split(","):
            results[name] = run_row(name, fleet, schedule, args, work, owned)
            r = results[name]
            if r.get("started"):
                print(f"{name}: goodput {r['goodput_rps']} req/s, {r['ok_200']}/{r['offered']} "
                      f"ok, hit rate {r['engine_cache']['hit_rate']}", flush=True)
    finally:
        for o in reversed(owned):
            o.stop()
    return facts, results


def main() -> int:
    args = _args()
    stop_on_sigterm()
    if shutil.which("taskset") is None:
        print("prefix: taskset is not installed", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="nw-prefix-"))
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    try:
        facts, results = _run(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report = {"schema": "narwhal.bench.prefix", "schema_version": 1, "started_utc": started,
              "workload": args.workload, "rate": args.rate, "seconds": args.seconds,
              "seed": args.seed, "slo": {"ttft_s": args.ttft, "tpot_s": args.tpot},
              "timing": TIMING.__dict__, "block_size": BLOCK, "cache_blocks": args.cache_blocks,
              "split": "2 prefill + 2 decode (sglang-router: 4 aggregated workers)",
              "trace_file": str(args.trace_file.name) if args.workload == "mooncake" else None,
              "schedule": facts, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"prefix-{started.replace(':', '')}.json"
    path.write_text(json.dumps(report, indent=1))
    print()
    print(table(results, facts["reuse"]["ceiling"]))
    print(f"\nwrote {path}" + (f"; scratch kept in {work}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
