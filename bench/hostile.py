#!/usr/bin/env python3
"""The router under hostile clients: a normal client's latency while one attack runs.

    .venv/bin/python bench/hostile.py [--seconds 20] [--attacks huge-headers,idle-sockets,...]

For each attack a fresh narwhal-serve starts under RLIMIT_NOFILE 1024 (the common default, and
the limit at which 1,100 idle sockets used to stop it) over two zero-delay engine emulators.
The router is pinned alone to core 0; engines, the normal client and the attacker share core 1,
the attacker at nice 19 (it stands for a client on another machine, whose CPU is not the
fleet's; at equal priority a 2-core machine measures the attacker's own load on the engines).
The normal client sends one non-streamed completion (64-word prompt, 8 tokens) at a time, each
on a new connection (so it must be admitted like any newcomer), first unloaded for
`--baseline` seconds, then for `--seconds` while the attack runs. Reported per attack: the
normal client's p50/p99/max and errors in both phases and the p99 ratio (the bar is 2x), the
controller lease (renewals during the attack, role and epoch unchanged), engine ejections, and
the router's connection counters. Attacks (issue 13):

- huge-headers   4 connections, each streaming a 64 MiB header in 64 KiB writes, reconnecting
- idle-sockets   1,100 sockets held open and silent, each reopened at the next 1 s round
- slowloris      600 connections sending one header byte a second, reopened the same way
- kv-exhaust     8 loops of requests whose prompt plus max_tokens overflow the context
- connect-flood  (not in the default set) idle-sockets reopening each socket at once: a
                 connection flood, whose rate is for a firewall to limit (docs/security.md)

The summary goes to results/hostile-<time>.json. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _procs import Owned, cpu_seconds, free_port, start, stop_on_sigterm, wait_status
from _targets import start_engines

HERE = Path(__file__).resolve().parent
PROMPT = " ".join(f"word{k}" for k in range(64))
NOFILE = 1024
ATTACKS = ("huge-headers", "idle-sockets", "slowloris", "kv-exhaust")


# -- the normal client (a child process) ---------------------------------------------------

def normal_client(port: int, seconds: float, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8}).encode()
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            status = str(resp.status)
        except (OSError, http.client.HTTPException) as exc:
            status = type(exc).__name__
        elapsed = time.monotonic() - t0
        if status == "200":
            latencies.append(elapsed)
        else:
            errors[status] = errors.get(status, 0) + 1
        time.sleep(0.01)
    latencies.sort()
    return {"requests": len(latencies) + sum(errors.values()), "errors": errors,
            "p50_ms": round(1e3 * statistics.median(latencies), 2) if latencies else None,
            "p99_ms": round(1e3 * latencies[int(0.99 * (len(latencies) - 1))], 2)
            if latencies else None,
            "max_ms": round(1e3 * latencies[-1], 2) if latencies else None}


# -- attackers (a child process) -----------------------------------------------------------

async def _huge_headers(port: int, stop_at: float, stats: dict[str, int]) -> None:
    piece = b"a" * 65536
    while time.monotonic() < stop_at:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            stats["connections"] += 1
            writer.write(b"GET /health HTTP/1.1\r\nhost: r\r\nx-big: ")
            for _ in range(1024):  # 64 MiB
                writer.write(piece)
                await writer.drain()
                stats["bytes"] += len(piece)
                if time.monotonic() >= stop_at:
                    break
            writer.close()
        except OSError:
            stats["refused"] += 1
            await asyncio.sleep(0.01)


async def _held_socket(port: int, stop_at: float, stats: dict[str, int], drip: bool,
                       rounds: bool = True) -> None:
    """One of the sockets the attacker keeps open; like slowloris tools, a socket the router
    closed is opened again at the attacker's next round (once a second), or at once when
    `rounds` is off (a connection flood)."""
    first = True
    while time.monotonic() < stop_at:
        if not first and rounds:
            await asyncio.sleep(1.0 - time.monotonic() % 1.0)
        first = False
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            stats["refused"] += 1
            await asyncio.sleep(0.05)
            continue
        stats["connections"] += 1
        try:
            if drip:
                writer.write(b"POST /v1/completions HTTP/1.1\r\n")
            while time.monotonic() < stop_at:
                if drip:
                    writer.write(b"x")
                    await writer.drain()
                try:
                    data = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    continue
                if not data:
                    stats["closed_by_router"] += 1
                    break
        except OSError:
            stats["closed_by_router"] += 1
        finally:
            writer.close()


async def _kv_exhaust(port: int, stop_at: float, stats: dict[str, int], model: str) -> None:
    body = json.dumps({"model": model, "prompt": "the sea " * 300, "max_tokens": 1900}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n%b" % (len(body), body))
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            while time.monotonic() < stop_at:
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                stats["requests"] += 1
                stats["status_" + head.split(b" ")[1].decode()] += 1
            writer.close()
        except (OSError, asyncio.IncompleteReadError, IndexError):
            stats["refused"] += 1
            await asyncio.sleep(0.01)


async def attacker(kind: str, port: int, seconds: float, model: str) -> dict[str, int]:
    from collections import defaultdict
    stats: dict[str, int] = defaultdict(int)
    stop_at = time.monotonic() + seconds
    if kind == "huge-headers":
        jobs = [_huge_headers(port, stop_at, stats) for _ in range(4)]
    elif kind == "idle-sockets":
        jobs = [_held_socket(port, stop_at, stats, False) for _ in range(1100)]
    elif kind == "slowloris":
        jobs = [_held_socket(port, stop_at, stats, True) for _ in range(600)]
    elif kind == "connect-flood":
        jobs = [_held_socket(port, stop_at, stats, False, rounds=False) for _ in range(1100)]
    else:
        jobs = [_kv_exhaust(port, stop_at, stats, model) for _ in range(8)]
    await asyncio.gather(*jobs)
    return dict(stats)


# -- the run -------------------------------------------------------------------------------

def _router(engines: Any, work: Path, name: str) -> Owned:
    p, d = engines.urls()
    fleet = work / f"{name}-fleet.json"
    fleet.write_text(json.dumps({
        "schema": "narwhal.fleet", "schema_version": 1, "model": engines.model,
        "engines": [{"id": "p0", "url": p, "role": "prefill"},
                    {"id": "d0", "url": d, "role": "decode"}],
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
        "journal": {"path": str(work / f"{name}-journal.jsonl")}}))
    port = free_port()
    serve = Path(sys.executable).parent / "narwhal-serve"
    r = start(name, ["prlimit", f"--nofile={NOFILE}:{NOFILE}", str(serve), "--fleet", str(fleet),
                     "--port", str(port)], cpu="0", log=work / f"{name}.log", port=port)
    wait_status(port, "/ready", 30, r.proc)
    return r


def _state(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/narwhal/state")
    doc = json.loads(conn.getresponse().read())
    conn.close()
    return dict(doc)


def _child(role: str, *args: str) -> subprocess.Popen[bytes]:
    # The attacker stands for a client on another machine: at nice 19 it runs on what CPU the
    # fleet and the normal client leave, so its own work is not charged to the router.
    nice = ["nice", "-n", "19"] if role == "attacker" else []
    return subprocess.Popen([*nice, "taskset", "-c", "1", sys.executable, __file__, "--role",
                             role, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _result(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=120)
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def run_attack(kind: str, engines: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    router = _router(engines, work, f"router-{kind}")
    try:
        port = str(router.port)
        base = _result(_child("client", port, str(args.baseline), engines.model))
        before = _state(router.port)
        attack = _child("attacker", port, str(args.seconds + 1), engines.model, kind)
        time.sleep(1.0)  # the attack is under way before the normal client starts
        cpu0, t0 = cpu_seconds(router.tree()), time.monotonic()
        loaded = _result(_child("client", port, str(args.seconds), engines.model))
        router_cpu = (cpu_seconds(router.tree()) - cpu0) / (time.monotonic() - t0)
        hits = _result(attack)
        alive = router.proc.poll() is None
        after = _state(router.port) if alive else {
            "controller": {"role": "exited", "epoch": -1, "renewals": 0}, "engines": []}
    finally:
        router.stop()
    lead0, lead1 = before["controller"], after["controller"]
    ratio = (loaded["p99_ms"] / base["p99_ms"]) if loaded["p99_ms"] and base["p99_ms"] else None
    return {
        "attack": kind, "router_alive": alive, "unloaded": base, "under_attack": loaded,
        "p99_ratio": round(ratio, 2) if ratio else None,
        "lease": {"role": lead1["role"], "epoch_unchanged": lead0["epoch"] == lead1["epoch"],
                  "renewals_during": lead1["renewals"] - lead0["renewals"]},
        "ejections": sum(e["ejections"] for e in after["engines"]),
        "connections": after.get("connections"), "attacker": hits,
        "router_cpu_share": round(router_cpu, 3),
        "passed": bool(alive and ratio is not None and ratio <= 2.0
                       and not loaded["errors"] and lead1["role"] == "primary"
                       and lead0["epoch"] == lead1["epoch"]
                       and not any(e["ejections"] for e in after["engines"])),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", default="bench", choices=["bench", "client", "attacker"])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--baseline", type=float, default=8.0)
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("rest", nargs="*")
    args = p.parse_args()
    if args.role == "client":
        port, seconds, model = args.rest
        print(json.dumps(normal_client(int(port), float(seconds), model)))
        return 0
    if args.role == "attacker":
        port, seconds, model, kind = args.rest
        print(json.dumps(asyncio.run(attacker(kind, int(port), float(seconds), model))))
        return 0
    stop_on_sigterm()
    rows = []
    with tempfile.TemporaryDirectory(prefix="narwhal-hostile-") as tmp:
        work = Path(tmp)
        engines = start_engines("emulator", "1", work, None)
        try:
            for kind in args.attacks.split(","):
                row = run_attack(kind, engines, work, args)
                rows.append(row)
                print(f"{kind:13s} p99 {row['unloaded']['p99_ms']} -> "
                      f"{row['under_attack']['p99_ms']} ms (x{row['p99_ratio']}), errors "
                      f"{row['under_attack']['errors']}, lease {row['lease']}, ejections "
                      f"{row['ejections']}, {'PASS' if row['passed'] else 'FAIL'}", flush=True)
        finally:
            engines.prefill.stop()
            engines.decode.stop()
    out = HERE / "results" / f"hostile-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    out.write_text(json.dumps({"seconds": args.seconds, "nofile": NOFILE, "cpus": os.cpu_count(),
                               "host": socket.gethostname(), "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
