#!/usr/bin/env python3
"""How long a producer engine holds a request's KV after its consumer dies mid-transfer:
Narwhal's router against narwhal-inference 0.7.0 and vllm-router 0.1.17, in one run.

    .venv/bin/python bench/kv_release.py [--repeats 3] [--scenarios killed,stuck]
        [--routers narwhal,narwhal-inference,vllm-router] [--handoff-budget 1.0]

In P/D a prefill engine (the producer) keeps a request's KV blocks under a lease until a
decode engine (the consumer) pulls them; if the consumer dies mid-transfer, vLLM frees them
only when the lease runs out (`kv_lease_duration`, 30 s by default). The emulator models it:
`cut_pulls` on a consumer makes its pulls start and move nothing, and the producer's own
`vllm:kv_cache_usage_perc` counts the blocks it holds for remote readers.

One fleet of timed emulators (goodput.py's Timing and split: 2 prefill + 2 decode). Per
router, scenario and repetition: a fresh router (its profile store written from the engines'
live generations), every pair warmed with short non-streaming requests (checked pair by pair
in Narwhal's journal; for a peer on the engines' own counters), then every consumer's
pulls cut and one greedy streamed completion sent (a long prompt, so its blocks stand out on
the producer's gauge); the consumer stuck pulling is found on its fetch gauge and the cut on
the others is cleared. Then

- `killed`: the stuck consumer gets SIGKILL, a handful of other requests are sent at once,
  and the time from the kill until the producer has released the request's KV is measured;
- `stuck`: nothing more; the time from the send until the producer released it.

The producer's gauge is polled every 10 ms, bounded at the lease plus 15 s. Released means
the producer's usage fell below half of what it held for the request (the other requests'
blocks are a fraction of that); `all_free_s` is until every producer's usage is 0. A lease
that ran out shows on the producer's `vllm:nixl_num_kv_expired_reqs`. The client's outcome is
compared with the answer the producer itself gives the same prompt (greedy answers are a
function of the tokens on every emulator). In `stuck`, a request still unanswered after the
KV was released (or at the bound) has its edge mended, and the outcome is what it got then.
Afterwards a killed engine is started again on its ports, faults cleared, engines drained.
Narwhal runs with `serving.handoff_budget_s` (Gate D's budget, the .env default 1 s); the
peers as goodput.py starts them. Summary only in `results/kv-release-<UTC time>.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _goodput_fleet import (
    Fleet,
    Timing,
    start_fleet,
    start_narwhal,
    start_narwhal_inference,
    start_router,
    tokenize_count,
)
from _procs import Owned, descendants, http_status, start, stop_on_sigterm, wait_status
from _targets import REPO

HERE = Path(__file__).resolve().parent
ROUTERS = ("narwhal", "narwhal-inference", "vllm-router")
SCENARIOS = ("killed", "stuck")
LEASE_S = 30.0  # the emulator's kv_lease_duration, vLLM's default
BOUND_S = LEASE_S + 15.0
POLL_S = 0.01
STREAM_TOKENS = 40
SLO = {"ttft_s": 0.3, "tpot_s": 0.025}  # goodput.py's default objectives
USAGE = "vllm:kv_cache_usage_perc"
FETCH = "vllm:num_requests_kv_fetch_by_stage"
XFERS = "vllm:nixl_xfer_time_seconds_count"
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
PROMPTS = "vllm:prompt_tokens_total"


def scrape(port: int) -> str:
    """An engine's /metrics text ('' when it does not answer: a dead engine reads as idle)."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        status, body = http_status(port, "/metrics", timeout=2.0)
        if status == 200:
            return body.decode()
    return ""


def metric(text: str, name: str, label: str = "") -> float:
    """The sum of a metric's series (those with `label` among their labels) in /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ") \
                and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def fault(port: int, name: str) -> None:
    """Set or clear an emulator fault (POST /emu/fault), every producer as the peer."""
    status, body = http_status(port, "/emu/fault", "POST", json.dumps({"fault": name}).encode())
    if status != 200:
        raise RuntimeError(f"/emu/fault {name} on :{port} answered {status}: {body[:200]!r}")


@dataclass
class Rig:
    """The fleet this run measures every router on, and the settings of the run."""

    fleet: Fleet
    timing: Timing
    args: argparse.Namespace
    work: Path
    prompt_words: list[str] = field(default_factory=list)
    heal_s: list[float] = field(default_factory=list)  # after each repetition

    def role(self, role: str) -> list[int]:
        """The engines of a role, by index (start_fleet's split: the first half prefill)."""
        return [i for i, r in enumerate(self.fleet.roles) if r == role]

    def port(self, i: int) -> int:
        """Engine i's port now (a restarted engine keeps its port, not its process)."""
        return self.fleet.engines[i].port

    def alive(self, i: int) -> bool:
        """Whether engine i still runs (a killed one is restarted after the repetition)."""
        return self.fleet.engines[i].proc.poll() is None

    def sum_over(self, engines: list[int], name: str, label: str = "") -> dict[int, float]:
        """A metric on each of these engines, from their own /metrics (the routers' view
        is what is measured, so the engines are the witnesses)."""
        return {i: metric(scrape(self.port(i)), name, label) for i in engines}

    def prompt(self, salt: str) -> str:
        """A long prompt with a unique head: no engine has any of it cached."""
        return f"{salt} " + " ".join(self.prompt_words)


class Client:
    """One greedy streamed completion read in a thread: status, tokens, text, errors."""

    def __init__(self, port: int, prompt: str, request_id: str, timeout_s: float) -> None:
        """Send at once: a router answers a stream's head only with its first byte, which a
        cut edge holds back, so the bench must go on while the request waits."""
        self.body = {"model": "tiny", "prompt": prompt, "max_tokens": STREAM_TOKENS,
                     "temperature": 0, "stream": True}
        self.result: dict[str, Any] = {"status": 0, "tokens": 0, "done": False, "text": "",
                                       "error_events": 0}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        self.request_id = request_id
        self.sent = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        """Read the whole stream; every way it can end is recorded, none raised."""
        res = self.result
        try:
            self.conn.request("POST", "/v1/completions", json.dumps(self.body),
                              {"content-type": "application/json",
                               "x-request-id": self.request_id})
            resp = self.conn.getresponse()
            res["status"] = resp.status
            if resp.status != 200:
                res["body"] = resp.read()[:200].decode(errors="replace")
                return
            for raw in resp:
                line = raw.strip()
                if line == b"data: [DONE]":
                    res["done"] = True
                elif line.startswith(b"data: "):
                    self._event(json.loads(line[6:]))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            res["exception"] = type(exc).__name__
        finally:
            res["ended_s"] = round(time.monotonic() - self.sent, 3)

    def _event(self, event: dict[str, Any]) -> None:
        """One SSE event: a token counted, or an error the router sent after its 200."""
        if "error" in event:
            self.result["error_events"] += 1
            self.result["error"] = str(event["error"])[:200]
        for choice in event.get("choices") or ():
            if choice.get("text"):
                self.result["tokens"] += 1
                self.result["text"] += choice["text"]

    def wait(self, seconds: float) -> bool:
        """Whether the read ended within `seconds` (every wait in the bench is bounded)."""
        self.thread.join(max(0.0, seconds))
        return not self.thread.is_alive()

    def abort(self) -> None:
        """End a read the router never answers (the bench's bound)."""
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)
        self.result.setdefault("aborted_by_bench", True)


def outcome(res: dict[str, Any], reference: str) -> str:
    """What the client got, in one word: whole (the reference answer), wrong-text,
    truncated, error-event, http-<status>, or the exception that ended the read."""
    if res.get("aborted_by_bench"):
        return "no-answer"
    if res["status"] != 200:
        return f"http-{res['status']}" if res["status"] else res.get("exception", "no-status")
    if res["error_events"]:
        return "error-event"
    if not res["done"] or res["tokens"] < STREAM_TOKENS or res.get("exception"):
        return "truncated"
    return "whole" if res["text"] == reference else "wrong-text"


def reference(rig: Rig, prompt: str) -> str:
    """The answer the producer gives the prompt itself, with no transfer (the reference)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": STREAM_TOKENS,
            "temperature": 0}
    status, data = http_status(rig.port(rig.role("prefill")[0]), "/v1/completions", "POST",
                               json.dumps(body).encode(), timeout=30)
    if status != 200:
        raise RuntimeError(f"reference answered {status}: {data[:200]!r}")
    return str(json.loads(data)["choices"][0]["text"])


def post(port: int, request_id: str, body: dict[str, Any], timeout_s: float) -> int:
    """One non-streaming completion with its request id (Narwhal's journal keys rows by it);
    its status, 0 when it got no answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"content-type": "application/json", "x-request-id": request_id})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def post_many(port: int, tag: str, n: int, max_tokens: int, timeout_s: float) -> list[int]:
    """`n` short non-streaming completions sent at once; their statuses."""
    statuses = [0] * n

    def one(k: int) -> None:
        """A request of its own thread: they must reach the router together."""
        body = {"model": "tiny", "prompt": f"{tag}-{k} the state of things", "stream": False,
                "max_tokens": max_tokens, "temperature": 0}
        statuses[k] = post(port, f"{tag}-{k}", body, timeout_s)

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 5)
    return statuses


def journal_pairs(journal: Path, prefix: str) -> set[tuple[str, str]]:
    """The producer->consumer pairs Narwhal's journal shows handing off for these requests."""
    pairs = set()
    if journal.exists():
        for line in journal.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if str(row.get("request_id", "")).startswith(prefix) and row.get("status") == 200 \
                    and row.get("prefill_engine") and row.get("decode_engine"):
                pairs.add((str(row["prefill_engine"]), str(row["decode_engine"])))
    return pairs


def warm(rig: Rig, port: int, tag: str, journal: Path | None) -> dict[str, Any]:
    """Hand KV over every producer->consumer pair through the router (a pair's first handoff
    makes its NIXL connection; Narwhal gives a pair that has handed off before the handoff
    budget's deadline). Checked pair by pair in Narwhal's journal; for a peer, on the
    engines' own counters (each consumer pulled once per producer, each producer prefilled),
    which is exact only with one producer."""
    producers, consumers = rig.role("prefill"), rig.role("decode")
    want = {(f"e{p}", f"e{d}") for p in producers for d in consumers}
    pulls0, prompts0 = rig.sum_over(consumers, XFERS), rig.sum_over(producers, PROMPTS)
    statuses: list[int] = []
    for rnd in range(12):
        # alternating how many run at once spreads them over other pairs
        statuses += post_many(port, f"{tag}-warm{rnd}", 1 + rnd % 4, 2, 30.0)
        time.sleep(0.1)  # the journal writer
        pulls, prompts = rig.sum_over(consumers, XFERS), rig.sum_over(producers, PROMPTS)
        pulled = {i: int(pulls[i] - pulls0[i]) for i in consumers}
        prefilled = {i: int(prompts[i] - prompts0[i]) for i in producers}
        pairs = journal_pairs(journal, f"{tag}-warm") if journal is not None else None
        every = pairs >= want if pairs is not None else \
            all(v >= len(producers) for v in pulled.values()) and all(prefilled.values())
        if rnd >= 1 and every:
            break
    return {"requests": len(statuses), "statuses": dict(Counter(map(str, statuses))),
            "pulls_per_consumer": {f"e{i}": v for i, v in pulled.items()},
            "pairs": sorted(map("->".join, pairs)) if pairs is not None else None,
            "every_pair": every}


def cut_and_send(rig: Rig, port: int, request_id: str, prompt: str
                 ) -> tuple[Client, int | None, dict[int, float]]:
    """Every consumer's pulls cut, the streamed request sent: the consumer it stuck on (its
    fetch gauge), with the cut on the others cleared, and what each producer held then."""
    consumers = rig.role("decode")
    for i in consumers:
        fault(rig.port(i), "cut_pulls")
    client = Client(port, prompt, request_id, BOUND_S + 30)
    stuck = None
    while stuck is None and time.monotonic() < client.sent + 5.0:
        for i in consumers:
            if metric(scrape(rig.port(i)), FETCH, 'stage="in_progress"') > 0:
                stuck = i
                break
        else:
            time.sleep(POLL_S)
    for i in consumers:
        if i != stuck:
            fault(rig.port(i), "clear")
    held = rig.sum_over(rig.role("prefill"), USAGE)
    return client, stuck, held


def wait_released(rig: Rig, held: dict[int, float], t0: float) -> dict[str, Any]:
    """Poll the producers' KV usage from `t0` (bounded): when the producer that held the
    request's blocks fell below half of it (released), and when every producer reads 0."""
    holder = max(held, key=lambda i: held[i])
    level = held[holder]
    released = all_free = None
    peak = dict(held)
    while time.monotonic() < t0 + BOUND_S and (released is None or all_free is None):
        texts = {i: scrape(rig.port(i)) for i in held}
        now = time.monotonic()
        if not all(texts.values()):  # a scrape that failed is no reading, not a zero
            time.sleep(POLL_S)
            continue
        usage = {i: metric(t, USAGE) for i, t in texts.items()}
        for i, u in usage.items():
            peak[i] = max(peak[i], u)
        if released is None and usage[holder] < level / 2:
            released = now - t0
        if all_free is None and all(u == 0.0 for u in usage.values()):
            all_free = now - t0
        time.sleep(POLL_S)
    return {"released_s": None if released is None else round(released, 3),
            "all_free_s": None if all_free is None else round(all_free, 3),
            "held_usage": level, "peak_usage": max(peak.values())}


def journal_row(folder: Path, request_id: str) -> dict[str, Any] | None:
    """Narwhal's journal row for the request (the writer waited for, bounded)."""
    path = folder / "journal.jsonl"
    keep = ("status", "outcome", "prefill_engine", "decode_engine", "decode_attempts",
            "continued")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line) if line.strip() else {}
                if row.get("request_id") == request_id:
                    return {k: row[k] for k in keep if k in row}
        time.sleep(0.1)
    return None


def kill_phase(rig: Rig, port: int, client: Client, stuck: int, held: dict[int, float],
               tag: str) -> dict[str, Any]:
    """SIGKILL the stuck consumer, send other requests at once, and time the release from the
    kill; then what the client got (bounded) and the others' statuses."""
    engine = rig.fleet.engines[stuck]
    killed = time.monotonic()
    os.kill(engine.pid, signal.SIGKILL)
    others: list[int] = []
    sender = threading.Thread(
        target=lambda: others.extend(post_many(port, f"{tag}-other", rig.args.others, 4, 20.0)),
        daemon=True)
    sender.start()
    engine.proc.wait(10)
    res = wait_released(rig, held, killed)
    if not client.wait(10.0):
        client.abort()
    sender.join(30.0)
    res["others"] = dict(Counter(map(str, others)))
    res["kill_after_send_s"] = round(killed - client.sent, 3)
    return res


def stuck_phase(rig: Rig, client: Client, stuck: int, held: dict[int, float]) -> dict[str, Any]:
    """The consumer alive, its edge cut: time the release from the send; a request still
    unanswered after that (or at the bound) has its edge mended, then what the client got."""
    res = wait_released(rig, held, client.sent)
    res["kill_after_send_s"] = 0.0
    res["edge_mended_for_answer"] = False
    if not client.wait(5.0):
        fault(rig.port(stuck), "clear")
        res["edge_mended_for_answer"] = True
        if not client.wait(15.0):
            client.abort()
    return res


def measure(rig: Rig, name: str, scenario: str, tag: str, router: Owned,
            folder: Path) -> dict[str, Any]:
    """One repetition on a started router: warm, cut, the scenario, and its record."""
    producers = rig.role("prefill")
    journal = folder / "narwhal" / "journal.jsonl" if name == "narwhal" else None
    rec: dict[str, Any] = {"warm": warm(rig, router.port, tag, journal)}
    expired = sum(rig.sum_over(producers, EXPIRED).values())
    prompt = rig.prompt(tag)
    client, stuck, held = cut_and_send(rig, router.port, tag, prompt)
    if stuck is None or max(held.values()) == 0.0:
        rec["error"] = "no consumer started pulling" if stuck is None else \
            "the producer held no KV for the request"
        if not client.wait(10.0):
            client.abort()
    else:
        rec["stuck_consumer"] = f"e{stuck}"
        rec.update(kill_phase(rig, router.port, client, stuck, held, tag)
                   if scenario == "killed" else stuck_phase(rig, client, stuck, held))
        if rec["released_s"] is not None:
            rec["released_since_send_s"] = round(rec["released_s"] + rec["kill_after_send_s"], 3)
    rec["leases_expired"] = int(sum(rig.sum_over(producers, EXPIRED).values()) - expired)
    rec["client"] = {k: v for k, v in client.result.items() if k != "text"}
    rec["outcome"] = outcome(client.result, reference(rig, prompt))
    if name == "narwhal":
        rec["journal"] = journal_row(folder / "narwhal", tag)
    return rec


def restart(rig: Rig, i: int) -> None:
    """Start a killed engine again on its ports with its flags, as a supervisor would."""
    old = rig.fleet.engines[i]
    argv, env, cpu = old.extra["argv"], old.extra["env"], old.extra["cpu"]
    new = start(old.name, argv, cpu=str(cpu), log=old.log, port=old.port,  # type: ignore[arg-type]
                env=env, cwd=REPO)  # type: ignore[arg-type]
    new.extra.update(old.extra)
    rig.fleet.engines[i] = new
    wait_status(new.port, "/health", 90, new.proc)


def idle(rig: Rig) -> bool:
    """Whether no engine runs, queues or pulls anything and no producer holds KV."""
    for i in range(len(rig.fleet.engines)):
        text = scrape(rig.port(i))
        busy = (metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
                + metric(text, FETCH, 'stage="in_progress"') + metric(text, USAGE))
        if not text or busy > 0:
            return False
    return True


def heal(rig: Rig) -> float:
    """Every engine running and idle again, faults cleared (a killed one restarted on its
    ports); seconds it took, bounded by the lease (a leaked lease runs out within it)."""
    t0 = time.monotonic()
    for i in range(len(rig.fleet.engines)):
        if rig.alive(i):
            with contextlib.suppress(RuntimeError, OSError, http.client.HTTPException):
                fault(rig.port(i), "clear")
        else:
            restart(rig, i)
    while not idle(rig):
        if time.monotonic() > t0 + LEASE_S + 5.0:
            raise RuntimeError("the engines are not idle after the lease")
        time.sleep(0.1)
    return round(time.monotonic() - t0, 3)


def start_one(rig: Rig, name: str, folder: Path) -> Owned:
    """A fresh router over the fleet (its profile store from the engines' live generations):
    Narwhal with Gate D's handoff budget, the peers as goodput.py starts them."""
    cpu = rig.args.router_cpu
    if name == "narwhal":
        return start_narwhal(rig.fleet, rig.timing, SLO, cpu, folder,
                             serving={"handoff_budget_s": rig.args.handoff_budget})
    if name == "narwhal-inference":
        return start_narwhal_inference(rig.fleet, rig.timing, SLO, cpu, folder,
                                       first_token_timeout_s=rig.args.nwi_first_token_timeout)
    return start_router(name, rig.fleet, rig.timing, SLO, cpu, folder)


def stop_strays(rig: Rig) -> None:
    """A router that never became ready is still running and its helper lost its handle:
    stop every process this bench started that is not an engine, by its PID."""
    engines = {pid for e in rig.fleet.engines for pid in e.tree()}
    for pid in descendants(os.getpid())[1:]:
        if pid not in engines:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def run_once(rig: Rig, name: str, scenario: str, rep: int) -> dict[str, Any]:
    """One repetition of one scenario on a fresh router; the fleet healed afterwards."""
    tag = f"{name}-{scenario}-{rep}"
    folder = rig.work / tag
    folder.mkdir()
    try:
        router = start_one(rig, name, folder)
    except Exception as exc:  # recorded; the router is skipped from here on
        stop_strays(rig)
        logs = sorted(folder.glob("*.log"))
        tail = logs[0].read_text(errors="replace")[-600:] if logs else ""
        return {"start_error": f"{type(exc).__name__}: {exc}", "log_tail": tail}
    try:
        return measure(rig, name, scenario, tag, router, folder)
    finally:
        router.stop()
        rig.heal_s.append(heal(rig))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and worst of the seconds to release, outcomes and statuses over repetitions."""
    done = [r for r in runs if "start_error" not in r and "error" not in r]
    times = [r["released_s"] for r in done if r.get("released_s") is not None]
    free = [r["all_free_s"] for r in done if r.get("all_free_s") is not None]
    ends = [r["client"]["ended_s"] for r in done if r["client"].get("ended_s") is not None]
    others: Counter[str] = Counter()
    for r in done:
        others.update(r.get("others") or {})
    return {
        "repetitions": len(runs), "measured": len(done),
        "errors": [r.get("start_error") or r.get("error") for r in runs if r not in done],
        "median_s": round(statistics.median(times), 3) if times else None,
        "worst_s": round(max(times), 3) if len(times) == len(done) and times else None,
        "unreleased_within_bound": len(done) - len(times),
        "released_s": times,
        "before_lease": sum(1 for r in done if (r.get("released_since_send_s") or 1e9) < LEASE_S),
        "all_free_median_s": round(statistics.median(free), 3) if free else None,
        "leases_expired": sum(r["leases_expired"] for r in done),
        "outcomes": dict(Counter(r["outcome"] for r in done)),
        "others": dict(others) if others else None,
        "stuck_consumers": [r.get("stuck_consumer") for r in done],
        "held_usage": [r["held_usage"] for r in done],
        "answer_median_s": round(statistics.median(ends), 3) if ends else None,  # the producer's gauge, the request's KV
        "warm_every_pair": all(r["warm"]["every_pair"] for r in done),
        "journal": [r["journal"] for r in done if r.get("journal")] or None,
        "clients": [r["client"] for r in done],
    }


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each peer's median seconds to release over Narwhal's, per scenario, same run."""
    out: dict[str, dict[str, float | None]] = {}
    ours = results.get("narwhal") or {}
    for name, res in results.items():
        if name == "narwhal":
            continue
        out[name] = {}
        for scenario, s in res.items():
            mine = (ours.get(scenario) or {}).get("median_s")
            out[name][scenario] = round(s["median_s"] / mine, 1) \
                if s.get("median_s") and mine else None
    return out


def _cell(value: float | None) -> str:
    """Seconds as the table prints them ('-' where none were measured)."""
    return "-" if value is None else f"{value:.3f}"


def table(results: dict[str, dict[str, Any]], rat: dict[str, dict[str, float | None]]) -> str:
    """The printed table: a row per router and scenario, then the ratios. `<lease`: the
    repetitions whose KV was released before the lease ran out; `expired`: leases that ran
    out on the producers meanwhile (other requests' included); `answer`: when the client's
    read ended, from the send."""
    lines = [f"{'router':<18}{'scenario':<9}{'reps':>4}{'median s':>9}{'worst s':>9}"
             f"{'<lease':>7}{'all free':>9}{'expired':>8}{'answer':>8}  "
             f"{'client outcomes':<22}others"]
    for name, res in results.items():
        for scenario, s in res.items():
            worst = f">{BOUND_S:.0f}" if s["unreleased_within_bound"] else _cell(s["worst_s"])
            outs = ", ".join(f"{k} x{v}" for k, v in s["outcomes"].items()) or \
                "; ".join(map(str, s["errors"]))[:60]
            others = ", ".join(f"{k} x{v}" for k, v in (s["others"] or {}).items()) or "-"
            lease = f"{s['before_lease']}/{s['measured']}"
            lines.append(f"{name:<18}{scenario:<9}{s['measured']:>4}{_cell(s['median_s']):>9}"
                         f"{worst:>9}{lease:>7}{_cell(s['all_free_median_s']):>9}"
                         f"{s['leases_expired']:>8}{_cell(s['answer_median_s']):>8}  "
                         f"{outs:<22}{others}")
    for name, per in rat.items():
        cells = ", ".join(f"{sc} {'-' if v is None else f'{v:g}x'}" for sc, v in per.items())
        lines.append(f"{name} / narwhal, median seconds to release: {cells}")
    return "\n".join(lines)


def prompt_words(port: int, tokens: int) -> list[str]:
    """Seeded words making a prompt of about `tokens` engine tokens (counted by /tokenize)."""
    words = [f"{a}{b}{c}" for a in "bdfgklmnprst" for b in "aeiou" for c in "lmnrst"]
    per_word = tokenize_count(port, "tiny", " ".join(words[:200])) / 200
    n = max(1, int(tokens / per_word))
    return [words[k % len(words)] for k in range(n)]


def _args() -> argparse.Namespace:
    """The command line, checked before any process starts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", type=int, default=4,
                    help="emulators, the first half (rounded down) prefill, the rest decode")
    ap.add_argument("--handoff-budget", type=float, default=1.0,
                    help="Narwhal's serving.handoff_budget_s (NARWHAL_WORKLOAD_TRANSFER_BUDGET_MS)")
    ap.add_argument("--nwi-first-token-timeout", type=float, default=30.0,
                    help="narwhal-inference's engine.first_token_timeout_s (goodput.py's 30; "
                         "its own default is 2.5)")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--others", type=int, default=8, help="requests sent right after the kill")
    ap.add_argument("--router-cpu", default="0")
    ap.add_argument("--client-cpu", default="1")
    ap.add_argument("--engine-cpu", default="0-1")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (logs)")
    args = ap.parse_args()
    bad = [n for n in args.routers.split(",") if n not in ROUTERS] + \
        [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if bad or not 1 <= args.repeats <= 20 or args.engines < 3 or args.handoff_budget <= 0:
        ap.error(f"unknown {bad}, or --repeats not 1..20, --engines < 3, --handoff-budget <= 0")
    return args


def run_all(rig: Rig) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every repetition, routers interleaved within each (drift touches them alike); a
    router that does not start is recorded and not tried again."""
    args = rig.args
    names = args.routers.split(",")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        n: {s: [] for s in args.scenarios.split(",")} for n in names}
    failed: set[str] = set()
    for rep in range(args.repeats):
        for scenario in args.scenarios.split(","):
            for name in names:
                if name in failed:
                    continue
                t0 = time.monotonic()
                rec = run_once(rig, name, scenario, rep)
                runs[name][scenario].append(rec)
                if "start_error" in rec:
                    failed.add(name)
                print(f"[{rep}] {name:<18} {scenario:<7} released {rec.get('released_s')} s, "
                      f"all free {rec.get('all_free_s')} s, client {rec.get('outcome')}, "
                      f"others {rec.get('others')}, "
                      f"{rec.get('start_error') or rec.get('error') or ''}"
                      f"({time.monotonic() - t0:.1f} s)", flush=True)
    return runs


def main() -> int:
    """Start the fleet, run every repetition, write the summary and print the table; the
    engines are stopped by their PIDs whatever happens."""
    args = _args()
    stop_on_sigterm()
    if shutil.which("taskset") is None:
        print("kv_release: taskset is not installed", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="nw-kv-release-"))
    timing = Timing()
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    t0 = time.monotonic()
    fleet: Fleet | None = None
    try:
        fleet = start_fleet(args.engines, timing, args.engine_cpu, work)
        rig = Rig(fleet, timing, args, work)
        rig.prompt_words = prompt_words(rig.port(0), args.prompt_tokens)
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
        runs = run_all(rig)
    finally:
        for engine in fleet.engines if fleet is not None else ():
            engine.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    results = {n: {s: summarize(r) for s, r in per.items()} for n, per in runs.items()}
    rat = ratios(results)
    report = {
        "schema": "narwhal.bench.kv_release", "schema_version": 1, "started_utc": started,
        "wall_s": round(time.monotonic() - t0, 1), "repeats": args.repeats,
        "split": f"{len(rig.role('prefill'))} prefill + {len(rig.role('decode'))} decode",
        "lease_s": LEASE_S, "bound_s": BOUND_S, "poll_s": POLL_S,
        "stream_tokens": STREAM_TOKENS, "prompt_tokens": args.prompt_tokens,
        "others_per_kill": args.others, "slo": SLO, "timing": asdict(timing),
        "narwhal_serving": {"handoff_budget_s": args.handoff_budget},
        "narwhal_inference_first_token_timeout_s": args.nwi_first_token_timeout,
        "heal_s": rig.heal_s, "results": results, "ratio_to_narwhal_median": rat}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"kv-release-{started.replace(':', '')}.json"
    path.write_text(json.dumps(report, indent=1))
    print()
    print(table(results, rat))
    print(f"\nwrote {path}" + (f"; scratch kept in {work}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
