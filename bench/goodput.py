#!/usr/bin/env python3
"""Goodput on a moving trace: Narwhal vs narwhal-inference 0.7.0 vs vllm-router 0.1.17.

    .venv/bin/python bench/goodput.py [--trace shifting|light] [--seconds 90] [--seed 0]
        [--ttft 0.3] [--tpot 0.025] [--max-requests 4000]
        [--routers narwhal,narwhal-profiled,narwhal-planner,narwhal-flips,narwhal-inference,
                   narwhal-inference-controller,vllm-router]

Four kv_both emulators with the same realistic timing model (prefill tens of ms for 1k tokens,
a decode step of about 10-20 ms; they sleep, so the 2-core machine is not the bottleneck) serve
all three routers in turn, each over the same split (2 prefill + 2 decode). One seeded trace,
replayed open-loop (Poisson arrivals, the arrival times fixed in advance) against each router,
moves through three equal phases: prefill-heavy (long prompts, few output tokens),
decode-heavy (short prompts, many output tokens) and mixed. The client streams every request
and records TTFT and mean TPOT; a request attains the SLO when it answered 200, streamed every
token, TTFT <= ttft and mean TPOT <= tpot. Goodput is attaining requests per second of the
phase. Narwhal and narwhal-inference get cost models from the emulators' own coefficients, so
their curve schedulers are active. Not part of `make test`.

Two traces. `light` keeps every phase inside what the fixed 2 + 2 split can serve (prefill pool
about 85% busy in the prefill-heavy phase): there, moving roles cannot help much and the
routers differ only in queueing. `shifting` (the default) sizes each phase so the four engines
together can serve it but a fixed 2 + 2 split cannot: the prefill-heavy phase offers about
2.1 s of prefill work per second (two prefill engines: 106% busy; three: 71%); in the
decode-heavy phase (38 requests/s of ~48 tokens, a decode step of 10 ms + 0.7 ms a stream)
the steady-state step on two decode engines is ~28 ms, over the 25 ms TPOT budget, and on
three ~17 ms by the model. Measured steps run above the model at this load (the two cores
carry four emulators, a router and the client, ~1800 SSE chunks/s), for every router alike.
(A decode phase of longer streams, ~3600 chunks/s, made the machine itself the bottleneck.) That is the case the pools that move
(`narwhal-planner`, `narwhal-flips`) exist for; the `narwhal` row keeps the fixed split.

narwhal-inference runs twice: `narwhal-inference` with every engine pinned (the fixed 2 + 2
split, as the `narwhal` row), and `narwhal-inference-controller` with its reactive role
controller on (engines unpinned, the controller tuning its own shipped fleets use). Each row
records, from the router's own /narwhal/state after the run, how it moved roles (`roles`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from _goodput_fleet import (
    Fleet,
    Timing,
    narwhal_profiles,
    nwi_profiles,
    start_fleet,
    start_router,
    tokenize_count,
)
from _kills import Killer
from _procs import Owned, stop_on_sigterm

HERE = Path(__file__).resolve().parent
ROUTERS = ("narwhal", "narwhal-profiled", "narwhal-planner", "narwhal-flips",
           "narwhal-inference", "narwhal-inference-controller", "vllm-router")


@dataclass(frozen=True)
class Phase:
    """One stretch of the trace: arrival rate and the request mix drawn from."""

    name: str
    rate: float  # requests per second
    prompt_tokens: tuple[int, int]  # uniform range
    output_tokens: tuple[int, int]
    long_share: float = 1.0  # mixed: share drawn from the prefill-heavy shape


TRACES = {
    "light": (
        Phase("prefill-heavy", 36.0, (900, 1500), (4, 12)),
        Phase("decode-heavy", 24.0, (32, 128), (64, 128)),
        Phase("mixed", 28.0, (0, 0), (0, 0), long_share=0.5),
    ),
    "shifting": (
        Phase("prefill-heavy", 44.0, (900, 1500), (4, 12)),
        Phase("decode-heavy", 38.0, (32, 128), (32, 64)),
        Phase("mixed", 30.0, (0, 0), (0, 0), long_share=0.5),
    ),
}
# Each trace's engine timing. `shifting` makes a decode stream dearer (0.7 ms a stream a step)
# rather than streams longer, so its decode pressure costs the 2-core machine fewer SSE chunks.
TIMINGS = {"light": Timing(), "shifting": Timing(decode_per_request=7.0e-4)}
PHASES = TRACES["shifting"]


@dataclass(frozen=True)
class Request:
    at: float  # seconds after the trace starts
    phase: str
    prompt_tokens: int
    max_tokens: int


def make_trace(seconds: float, seed: int, max_requests: int,
               phases: tuple[Phase, ...] = PHASES) -> list[Request]:
    """Open-loop Poisson arrivals, each phase a third of `seconds`; seeded, so replayable."""
    rng = random.Random(seed)
    span = seconds / len(phases)
    out: list[Request] = []
    for k, ph in enumerate(phases):
        t = k * span
        while len(out) < max_requests:
            t += rng.expovariate(ph.rate)
            if t >= (k + 1) * span:
                break
            shape = ph
            if ph.long_share < 1.0:
                shape = phases[0] if rng.random() < ph.long_share else phases[1]
            out.append(Request(round(t, 4), ph.name, rng.randint(*shape.prompt_tokens),
                               rng.randint(*shape.output_tokens)))
    return out


class Prompts:
    """Prompts of a given engine token count, built from seeded words and calibrated once."""

    def __init__(self, port: int, model: str, seed: int) -> None:
        rng = random.Random(seed + 1)
        self.words = [f"{rng.choice('bcdfgklmnprst')}{rng.choice('aeiou')}"
                      f"{rng.choice('lmnrst')}" for _ in range(4096)]
        sample = " ".join(self.words[:400])
        self.per_word = tokenize_count(port, model, sample) / 400
        self.port, self.model = port, model

    def text(self, tokens: int, salt: int) -> str:
        # A unique head per request keeps engines from sharing prefixes between requests.
        n = max(1, int(tokens / self.per_word))
        start = (salt * 7919) % len(self.words)
        body = [self.words[(start + i) % len(self.words)] for i in range(n)]
        return f"req{salt} " + " ".join(body)


async def one(session: aiohttp.ClientSession, url: str, model: str, req: Request, prompt: str,
              t_zero: float, timeout_s: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, t_zero + req.at - time.monotonic()))
    sent = time.monotonic()
    row: dict[str, Any] = {"phase": req.phase, "at": req.at, "prompt_tokens": req.prompt_tokens,
                           "max_tokens": req.max_tokens, "status": 0, "tokens": 0,
                           "ttft_s": None, "tpot_s": None, "lag_s": round(sent - t_zero - req.at, 4)}
    body = {"model": model, "prompt": prompt, "max_tokens": req.max_tokens, "stream": True,
            "temperature": 0}
    first = last = 0.0
    try:
        async with session.post(url, json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            row["status"] = resp.status
            if resp.status != 200:
                payload = await resp.read()
                try:  # why it was refused, where the router says (Narwhal: over_capacity ...)
                    error = json.loads(payload).get("error")
                    row["refusal"] = str(error.get("code") or error.get("type"))[:40] if \
                        isinstance(error, dict) else None
                    if isinstance(error, dict) and "time per output token" in str(
                            error.get("message")):
                        row["refusal"] = "tpot"
                except (ValueError, AttributeError):
                    pass
                return row
            async for raw in resp.content:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    row["done"] = True
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:  # the stream broke after its 200
                    row["stream_error"] = str((event["error"] or {}).get("code"))[:40]
                if not any(c.get("text") for c in event.get("choices", [])):
                    continue
                now = time.monotonic()
                if row["tokens"] == 0:
                    first = now
                last = now
                row["tokens"] += 1
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        row["error"] = type(exc).__name__
        return row
    if row["tokens"]:
        row["ttft_s"] = round(first - sent, 4)
        if row["tokens"] > 1:
            row["tpot_s"] = round((last - first) / (row["tokens"] - 1), 5)
    return row


async def replay(port: int, model: str, trace: list[Request], prompts: list[str],
                 timeout_s: float) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        t_zero = time.monotonic() + 0.5
        tasks = [asyncio.create_task(one(session, url, model, r, p, t_zero, timeout_s))
                 for r, p in zip(trace, prompts, strict=True)]
        return list(await asyncio.gather(*tasks))


def attains(row: dict[str, Any], ttft: float, tpot: float) -> bool:
    if row["status"] != 200 or row["tokens"] < row["max_tokens"] or row["ttft_s"] is None:
        return False
    return bool(row["ttft_s"] <= ttft and (row["tpot_s"] is None or row["tpot_s"] <= tpot))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))], 4)


def score(rows: list[dict[str, Any]], seconds: float, ttft: float, tpot: float) -> dict[str, Any]:
    span = seconds / len(PHASES)
    out: dict[str, Any] = {}
    for name, dur in [*[(p.name, span) for p in PHASES], ("overall", seconds)]:
        sel = [r for r in rows if name == "overall" or r["phase"] == name]
        good = [r for r in sel if attains(r, ttft, tpot)]
        ttfts = [r["ttft_s"] for r in sel if r["ttft_s"] is not None]
        tpots = [r["tpot_s"] for r in sel if r["tpot_s"] is not None]
        whole = [r for r in sel if r["status"] == 200 and r.get("done")
                 and not r.get("stream_error") and r["tokens"] >= r["max_tokens"]]
        out[name] = {"requests": len(sel), "ok_200": sum(r["status"] == 200 for r in sel),
                     "failed": len(sel) - len(whole),
                     "broken_streams": sum(r["status"] == 200 and r not in whole for r in sel),
                     "attaining": len(good),
                     "attainment": round(len(good) / len(sel), 4) if sel else None,
                     "goodput_rps": round(len(good) / dur, 3),
                     "ttft_p50_s": _pct(ttfts, 0.5), "ttft_p99_s": _pct(ttfts, 0.99),
                     "tpot_p50_s": _pct(tpots, 0.5), "tpot_p99_s": _pct(tpots, 0.99),
                     "max_lag_s": max((r["lag_s"] for r in sel), default=None)}
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    cols = [p.name for p in PHASES] + ["overall"]
    head = f"{'router':<18}" + "".join(f"{c:>30}" for c in cols)
    lines = [head, f"{'':<18}" + "".join(f"{'goodput/s  attain  p99 TTFT':>30}" for _ in cols)]
    for name, res in results.items():
        cells = []
        for c in cols:
            s = res[c]
            p99 = "-" if s["ttft_p99_s"] is None else f"{s['ttft_p99_s']:.3f}"
            cells.append(f"{s['goodput_rps']:>11.2f}  {100 * (s['attainment'] or 0):5.1f}%  {p99:>8}")
        lines.append(f"{name:<18}" + "".join(f"{c:>30}" for c in cells))
    for ours in ("narwhal", "narwhal-profiled", "narwhal-planner", "narwhal-flips"):
        if ours not in results:
            continue
        for base in ("narwhal-inference", "narwhal-inference-controller", "vllm-router"):
            if base not in results:
                continue
            cells = []
            for c in cols:
                b, n = results[base][c]["goodput_rps"], results[ours][c]["goodput_rps"]
                cells.append(f"{n / b:.2f}x" if b else ("inf" if n else "-"))
            label = {"narwhal-flips": "nwf / ", "narwhal-planner": "nwp / ",
                     "narwhal-profiled": "nw-prof / "}.get(ours, "nw / ") \
                + {"narwhal-inference-controller": "nwi+ctl"}.get(base, base[:12])
            lines.append(f"{label:<18}" + "".join(f"{c:>30}" for c in cells))
    return "\n".join(lines)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="trace length (three phases)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", choices=sorted(TRACES), default="shifting")
    ap.add_argument("--max-requests", type=int, default=4000)
    ap.add_argument("--ttft", type=float, default=0.3, help="SLO: seconds to first token")
    ap.add_argument("--tpot", type=float, default=0.025, help="SLO: mean seconds per output token")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--router-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--engine-cpu", default="0-1")
    ap.add_argument("--timeout", type=float, default=60.0, help="per request, seconds")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (logs)")
    ap.add_argument("--kill-every", type=float, default=0.0, metavar="S",
                    help="SIGKILL a decode engine every S seconds (in turn) and start it again")
    args = ap.parse_args()
    bad = [n for n in args.routers.split(",") if n not in ROUTERS]
    if bad or not args.routers:
        ap.error(f"--routers: unknown {bad}; choose from {', '.join(ROUTERS)}")
    if not 3.0 <= args.seconds <= 3600 or args.max_requests < 1 or args.ttft <= 0 or args.tpot <= 0:
        ap.error("--seconds must be 3..3600; --max-requests, --ttft, --tpot positive")
    return args


def _write(out: Path, stem: str, report: dict[str, Any], raw: dict[str, Any]) -> Path:
    """The summary (committed) and the per-request rows beside it (ignored by git)."""
    rows_path = out / "rows" / f"{stem}.json"
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    rows_path.write_text(json.dumps(raw))
    report["rows_file"] = str(rows_path.relative_to(out))
    path = out / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1))
    return path


def _measure(name: str, router: Owned, fleet: Fleet, trace: list[Request], prompts: list[str],
             args: argparse.Namespace, timing: Timing, work: Path
             ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One router's replay of the trace (with its kill schedule, if any): the rows and the
    scored result, printed as a line."""
    t0 = time.monotonic()
    killer = _killer(args.kill_every, fleet, timing, name, work)
    if killer is not None:
        killer.begin(t0 + 0.5)  # replay's clock starts half a second from now
    try:
        rows = asyncio.run(replay(router.port, fleet.model, trace, prompts, args.timeout))
    finally:
        kills = killer.end() if killer is not None else None
    wall = time.monotonic() - t0
    result = score(rows, args.seconds, args.ttft, args.tpot)
    result["roles"] = roles_moved(router.port)
    if kills is not None:
        result["kills"] = kills
        result["journal"] = _journal_summary(work / name / "journal.jsonl")
    o = result["overall"]
    print(f"{name}: {o['attaining']}/{o['requests']} attain, goodput {o['goodput_rps']} req/s, "
          f"{o['ok_200']} ok, {o['failed']} failed ({o['broken_streams']} broken after their "
          f"200), wall {wall:.1f} s", flush=True)
    return rows, result


def _journal_summary(path: Path) -> dict[str, Any] | None:
    """A Narwhal row's journal: outcomes, and the streams continued on another engine after
    theirs broke (None for a router that writes no such journal)."""
    if not path.exists():
        return None
    time.sleep(1.0)  # the journal writer catches up
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    outcomes: dict[str, int] = {}
    for row in rows:
        outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
    continued = [r for r in rows if r.get("continued")]
    return {"outcomes": outcomes, "continued_requests": len(continued),
            "continued_ok": sum(r["outcome"] == "ok" for r in continued),
            "continuations": sum(len(r["continued"]) for r in continued)}


def _killer(period_s: float, fleet: Fleet, timing: Timing, router: str,
            work: Path) -> Killer | None:
    """The kill schedule for one router's run (none without --kill-every). A restarted engine
    is a new generation: the router's profile rows for it are rewritten as re-profiling it
    would (Narwhal binds placement to them; narwhal-inference reads its own at start)."""
    if period_s <= 0:
        return None
    decode = [i for i, role in enumerate(fleet.roles) if role == "decode"]

    def restarted(_i: int) -> None:
        folder = work / ("nwi-controller" if router == "narwhal-inference-controller"
                         else "nwi" if router == "narwhal-inference" else router)
        store = folder / "profiles.json"
        if not store.exists():
            return
        doc = nwi_profiles(fleet, timing) if router.startswith("narwhal-inference") \
            else narwhal_profiles(fleet, timing)
        fresh = store.with_suffix(".new")
        fresh.write_text(json.dumps(doc, indent=1))
        fresh.replace(store)  # the router re-reads a store replaced whole

    return Killer(fleet.engines, decode, period_s, restarted)


def roles_moved(port: int) -> dict[str, Any]:
    """From the router's own /narwhal/state after the run: how it moved engines between the
    prefill and decode pools (both Narwhals and narwhal-inference answer there, each in its
    own shape), so a row that claims a controller shows that it acted."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/narwhal/state",
                                    timeout=10) as reply:
            state = json.load(reply)
    except (OSError, ValueError) as exc:
        return {"error": str(exc)[:200]}
    if "control" in state:  # narwhal-inference 0.7.0
        control = state.get("control") or {}
        return {"flips": control.get("flips"), "flip_reversals": control.get("flip_reversals"),
                "flips_refused": control.get("flips_refused"),
                "decisions": control.get("decisions"),
                "last_decision": (control.get("last_decision") or {}).get("reason"),
                "moves": [{k: f.get(k) for k in ("at", "iid", "to", "by")}
                          for f in state.get("flips") or []][:50],
                "pools": {k: len(v) if isinstance(v, list) else v
                          for k, v in (state.get("pools") or {}).items()}}
    engines = state.get("engines") or []
    scheduler = state.get("scheduler") or {}
    return {"current_roles": {str(e.get("id")): e.get("current_role") for e in engines},
            "last_flips": {str(e.get("id")): e.get("last_flip") for e in engines
                           if e.get("last_flip")},
            # what admission learned: its TTFT error margin and each decode engine's TPOT bias
            "ttft_model_error": scheduler.get("ttft_model_error"),
            "overflow": scheduler.get("overflow"),
            "tpot_model_error_s": {str(e.get("id")): e.get("tpot_model_error_s")
                                   for e in engines},
            "projection_error": {str(e.get("id")): e.get("projection_error")
                                 for e in engines if e.get("projection_error")}}


def main() -> int:
    args = _args()
    stop_on_sigterm()
    if shutil.which("taskset") is None:
        print("goodput: taskset is not installed", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="nw-goodput-"))
    timing = TIMINGS[args.trace]
    slo = {"ttft_s": args.ttft, "tpot_s": args.tpot}
    global PHASES
    PHASES = TRACES[args.trace]
    trace = make_trace(args.seconds, args.seed, args.max_requests, PHASES)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    owned: list[Owned] = []
    results: dict[str, dict[str, Any]] = {}
    raw: dict[str, list[dict[str, Any]]] = {}
    meta: dict[str, Any] = {}
    try:
        fleet: Fleet = start_fleet(4, timing, args.engine_cpu, work)
        owned += fleet.engines
        prompter = Prompts(fleet.engines[0].port, fleet.model, args.seed)
        prompts = [prompter.text(r.prompt_tokens, i) for i, r in enumerate(trace)]
        meta["tokens_per_word"] = round(prompter.per_word, 3)
        # The client is this process: pinned to its core like taskset would.
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
        print(f"trace: {len(trace)} requests over {args.seconds:.0f} s, "
              f"{prompter.per_word:.2f} tokens/word", flush=True)
        for name in args.routers.split(","):
            router = start_router(name, fleet, timing, slo, args.router_cpu, work)
            owned.append(router)
            print(f"{name}: ready in {router.extra.get('ready_s')} s", flush=True)
            raw[name], results[name] = _measure(name, router, fleet, trace, prompts, args,
                                                timing, work)
            router.stop()
            owned.remove(router)
            time.sleep(3.0)  # engines drain whatever a timed-out client left behind
    finally:
        for o in reversed(owned):
            o.stop()
        for o in fleet.engines if "fleet" in locals() else ():
            o.stop()  # engines a kill schedule started again
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"schema": "narwhal.bench.goodput", "schema_version": 1, "started": started,
              "trace": args.trace,
              "seconds": args.seconds, "seed": args.seed, "slo": slo, "timing": asdict(timing),
              "phases": [asdict(p) for p in PHASES], "split": "2 prefill + 2 decode (narwhal-planner / narwhal-flips: 4 kv_both, "
                       "roles moved by the planner / the reactive controller; "
                       "narwhal-inference-controller: unpinned, its own controller)",
              "requests": len(trace), "kill_every_s": args.kill_every or None, **meta,
              "results": results}
    path = _write(args.out, f"goodput-{started.replace(':', '')}", report, raw)
    print()
    print(table(results))
    print(f"\nwrote {path}" + (f"; scratch kept in {work}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
