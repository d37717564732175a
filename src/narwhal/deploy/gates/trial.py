"""Gate G, the capacity trial (`narwhal trial`): load through the private path, reconciled.

Needs Gate G passed and fresh (serve_refusal): a trial of a service no passed gate vouches
for would record some other fleet's capacity as this one's. One recorded activity, `load-trial`, whose attempt folder is
the trial's evidence (runs/<deployment>/load-trial/<id>/). Through SSH forwards from the
workstation to the router and Prometheus on the router host, for each rate in turn:
1. drain: the router's /narwhal/state shows nothing in flight (the next rate never starts on
   the previous one's tail);
2. the open-loop schedule (seeded Poisson arrivals, the workload's prompt length), every
   request sent at its time however many are in flight (within the client's stated connection
   budget, counted apart as client-limited when hit) with its own x-request-id, streamed and
   recorded (send time and lag, status, TTFT, token times, bytes); right after it, a network
   snapshot of the router host (network-<rate>.json: interfaces, routes, TCP sockets;
   trial/network.py);
3. the router's journal, read from the router host, reconciled with what was sent: every
   sent id exactly once, no id of the trial the client did not send;
4. a Prometheus snapshot through the tunnel (`up` of every target);
5. the summary (attainment, goodput, TTFT/TPOT percentiles, lag, client CPU) and the verdict,
   which says capacity only when nothing else explains a miss (verdict.py).
Every forward's open and cancel, and what ssh itself logged meanwhile, is kept as
tunnel.jsonl (trial/tunnel_log.py), also when a forward failed. Then the report (report.py):
report.html and its pictures in the same folder, readable offline.
Exit 0 when every rate's record holds (whatever the SLO attainment), 1 when a rate's record
does not (client-limited or saturated, records that do not reconcile, a scrape failure).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from narwhal.core.attainment import TARGET_ATTAINMENT
from narwhal.core.documents import canonical_json
from narwhal.core.errors import GateBlocked, HostError, Problem
from narwhal.core.trial_summary import RateSummary, TrialSummary
from narwhal.deploy.gates.serve import RouterHost, ServePlan, serving
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host, RunResult
from narwhal.deploy.hosts.forward_http import forwarded, http
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger.attempt import Attempt
from narwhal.deploy.ledger.status import GateStatus
from narwhal.deploy.trial import client, network, report
from narwhal.deploy.trial.reconcile import (
    cache_totals,
    continuation_totals,
    journal_rows,
    reconcile_rows,
)
from narwhal.deploy.trial.schedule import Planned, schedule
from narwhal.deploy.trial.trace import (
    MIN_BLOCK_WORDS,
    Scale,
    Trace,
    block_tokens_for,
    replay,
    reuse,
)
from narwhal.deploy.trial.tunnel_log import TunnelLog
from narwhal.deploy.trial.verdict import summarise, verdict

ACTIVITY = "load-trial"
COMMAND = "trial"  # how its errors are labelled: `narwhal trial: ...`
DRAIN_S = 60.0
VALID = ("within SLO", "capacity miss")  # every other verdict: the record does not hold
Progress = Callable[[str, str], None]


def serve_refusal(serve: GateStatus) -> str:
    """Why the trial must not start on Gate G as `narwhal status --offline` computes it ("" when
    passed and fresh): a trial measures the service Gate G vouched for, so a serve gate that is
    pending, failed, blocked or stale (its inputs moved) would have it measure something else
    and record that as the fleet's capacity. One line naming the state and the way out."""
    if serve.state == "passed":
        return ""
    why = f" ({serve.reason})" if serve.reason else ""
    return (f"gate {serve.letter} ({serve.gate}) is {serve.state}{why}; run `narwhal serve` "
            "(or `narwhal deploy`) until it passes, then the trial again; nothing was sent")


def _get_json(url: str) -> dict[str, Any] | None:
    """A JSON object through the tunnel (serve's one HTTP helper); None when none came."""
    status, body = http(url, timeout_s=5.0)
    try:
        doc = json.loads(body) if status == 200 else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def drain(base: str) -> float:
    """Wait until the router has nothing in flight; seconds waited (GateBlocked past DRAIN_S)."""
    started = time.monotonic()
    while time.monotonic() - started < DRAIN_S:
        state = _get_json(f"{base}/narwhal/state")
        if state is not None and state.get("inflight") == 0:
            return time.monotonic() - started
        time.sleep(0.2)
    raise GateBlocked(COMMAND, f"the router did not drain within {DRAIN_S:.0f} s", [Problem(
        "router inflight", "requests still in flight", "wait, or read /narwhal/state")])


def scrape(prometheus: str) -> dict[str, Any] | None:
    """Prometheus's `up` of every target through the tunnel, and each target's engine label;
    None when it did not answer."""
    doc = _get_json(f"{prometheus}/api/v1/query?query=up")
    if doc is None:
        return None
    up, engines = {}, {}
    for r in doc.get("data", {}).get("result", []):
        key = f"{r['metric'].get('job')} {r['metric'].get('instance')}"
        up[key], engines[key] = r["value"][1], r["metric"].get("engine", "")
    return {"up": up, "engines": engines}


def scrape_holds(snapshot: dict[str, Any] | None, expected: int, engines_out: set[str]) -> bool:
    """The monitoring held: Prometheus answered with every target, and each target that is
    down belongs to an engine the router itself has out (ejected or held: the fleet lost an
    engine, which the record shows; that is not a broken scrape)."""
    if snapshot is None or len(snapshot["up"]) < expected:
        return False
    engines = snapshot["engines"]
    return all(v == "1" or (bool(engines.get(k)) and engines.get(k) in engines_out)
               for k, v in snapshot["up"].items())


def profiled_tokens(host: Host, rh: RouterHost, workload_tokens: int) -> int:
    """The workload's prompt length in tokens, kept inside the profiled range (the smallest
    max_prompt_tokens any engine was profiled at), so the trial measures the fleet where its
    profiles price it."""
    done = host.run(cl.read_file(f"{rh.folder}/profiles.json"), timeout=60)
    try:
        rows = json.loads(done.stdout)["profiles"] if done.ok else []
        profiled = min(int(r["prefill"]["max_prompt_tokens"]) for r in rows)
    except (ValueError, KeyError, TypeError):
        return max(1, min(workload_tokens, 512))
    return max(1, min(workload_tokens, profiled))


def words_for(base: str, model: str, tokens: int, api_key: str | None) -> int:
    """How many prompt words make about `tokens` tokens with the fleet's own tokenizer (the
    router's /tokenize of a 100-word sample); nine tenths of that, so no prompt overshoots."""
    sample = client.prompt(schedule(1.0, 1, 0, 100, 1, "tokenize")[0])
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    status, body = http(f"{base}/tokenize", {"model": model, "prompt": sample}, auth)
    try:
        per_100 = int(json.loads(body)["count"]) if status == 200 else 800
    except (ValueError, KeyError, TypeError):
        per_100 = 800  # a tokenizer that splits words finely: stay short rather than over
    return max(1, int(tokens * 100 / max(per_100, 1) * 0.9))


def journal_size(host: Host, rh: RouterHost) -> int:
    """The journal's length in bytes now (0 before the router wrote any): each rate reads only
    what was appended after it, not the whole journal again."""
    done = host.run(cl.file_size(f"{rh.folder}/journal.jsonl"), timeout=60)
    try:
        return int(done.stdout.decode().strip()) if done.ok else 0
    except ValueError:
        return 0


def journal_since(host: Host, rh: RouterHost, offset: int) -> str:
    done = host.run(cl.read_from(f"{rh.folder}/journal.jsonl", offset), timeout=120)
    if not done.ok:
        raise HostError(host.alias, "the router's journal cannot be read "
                        f"({rh.folder}/journal.jsonl)")
    return done.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class Size:
    """How many requests each rate sends: a count, or about `duration_s` of the schedule."""

    requests: int | None = None
    duration_s: float | None = None

    def at(self, rate: float) -> int:
        if self.requests is None and self.duration_s is not None:
            return max(1, min(100_000, round(rate * self.duration_s)))
        return self.requests or 40


@dataclass(frozen=True)
class Route:
    """What every rate of one trial goes through: the router host, the plan as it serves now,
    and the workstation's ends of the SSH forwards to the router and Prometheus."""

    host: Host
    rh: RouterHost
    plan: ServePlan
    base: str
    prometheus: str
    api_key: str | None


@dataclass(frozen=True)
class Workload:
    """What each rate sends: how many requests, the schedule's seed and output cap, and either
    unique prompts of the workload's length or a replayed trace (trial/trace.py)."""

    size: Size
    seed: int
    max_tokens: int
    trace: Trace | None = None


def planner(route: Route, work: Workload, tokens: int,
            model: str) -> tuple[Callable[[float, str], list[Planned]], dict[str, Any]]:
    """How each rate's schedule is made, and what the record says of the workload: seeded
    Poisson arrivals of unique prompts about `tokens` long, or the trace scaled so 95 in 100
    of its prompts fit `tokens` (each hash block a run of words the fleet's tokenizer makes
    about block_tokens of)."""
    if work.trace is None:
        words = words_for(route.base, model, tokens, route.api_key)
        return (lambda rate, tag: schedule(rate, work.size.at(rate), work.seed, words,
                                           work.max_tokens, tag)), {}
    trace = work.trace
    block = block_tokens_for(trace.rows, tokens)
    scale = Scale(block, max(MIN_BLOCK_WORDS, words_for(route.base, model, block,
                                                        route.api_key)),
                  max(1, tokens // block), work.max_tokens)
    described = {"file": trace.name, "sha256": trace.sha256, "rows": len(trace.rows),
                 "block_tokens": scale.block_tokens, "block_words": scale.block_words,
                 "max_blocks": scale.max_blocks}
    return (lambda rate, tag: replay(trace, rate, work.size.at(rate), scale, work.seed,
                                     tag)), described


def run_trial(inputs: Inputs, host: Host, attempt: Attempt, p: ServePlan, rates: list[float],
              work: Workload, progress: Progress) -> dict[str, Any]:
    rh = RouterHost(host, p.install)
    p = serving(rh, p)  # after a takeover the primary answers at the standby's address
    slo = p.fleet["slo"]
    api_key = inputs.router.api_key.reveal() if inputs.router.api_key else None
    tag = f"trial-{attempt.id}-{os.urandom(3).hex()}"
    tokens = profiled_tokens(host, rh, inputs.workload.prompt_tokens)
    out: list[dict[str, Any]] = []
    data: list[report.RateData] = []
    tunnels = TunnelLog(host.alias, host.transport, host.session_log())
    try:
        with forwarded(host, [p.bind, p.prometheus_at], tunnels) as (router_port, prom_port):
            route = Route(host, rh, p, f"http://127.0.0.1:{router_port}",
                          f"http://127.0.0.1:{prom_port}", api_key)
            plan_rate, described = planner(route, work, tokens, p.fleet["model"])
            for rate in rates:
                rate_tag = f"{tag}-r{rate:g}"
                planned = plan_rate(rate, rate_tag)
                noted = {} if work.trace is None else {"trace_reuse": reuse(
                    work.trace.rows[:len(planned)], described["max_blocks"])}
                summary, rate_data = run_rate(route, attempt, rate, planned, rate_tag,
                                              progress, noted)
                out.append(summary)
                data.append(rate_data)
    finally:  # kept when a forward failed most of all: the log says which and why
        attempt.add_artifact("tunnel.jsonl", tunnels.jsonl())
    doc = TrialSummary.model_validate({
        "slo": slo, "seed": work.seed, "requests_per_rate": work.size.requests,
        "duration_s": work.size.duration_s, "tag": tag, "rates": out,
        **({"trace": described} if described else {})}).document()
    attempt.add_json("summary.json", doc)
    progress("report", "writing the report")
    files = report.build(f"Capacity trial {attempt.id} of {inputs.deployment}", slo, data,
                         fabric_heatmap(attempt), record_spans(attempt), TARGET_ATTAINMENT,
                         time.time())
    for name, content in files.items():
        attempt.add_artifact(name, content)
    doc["report"] = str(attempt.folder / report.REPORT)
    return doc


def network_snapshot(host: Host, rate: float) -> bytes:
    """The router host's interfaces, routes and TCP sockets now, through the host (each
    command's output bounded at the source): network-<rate>.json."""
    def ran(argv: list[str]) -> RunResult:
        return host.run(cl.bounded_output(network.OUTPUT_LIMIT, argv), timeout=60)

    return network.snapshot(host.alias, rate, ran(cl.ip_addresses()), ran(cl.ip_routes(4)),
                            ran(cl.ip_routes(6)), ran(cl.tcp_sockets()))


def run_rate(route: Route, attempt: Attempt, rate: float, planned: list[Planned], tag: str,
             progress: Progress, noted: dict[str, Any] | None = None,
             ) -> tuple[dict[str, Any], report.RateData]:
    """One rate: drained before and after, sent open loop, reconciled with the journal,
    scraped, summarised with its verdict (with `noted`, what the workload says of itself);
    every record kept as the rate's artifacts."""
    name, slo, p = f"rate-{rate:g}", route.plan.fleet["slo"], route.plan
    progress(f"rate {rate:g}/s", "draining the router")
    waited = drain(route.base)
    offset = journal_size(route.host, route.rh)
    progress(f"rate {rate:g}/s", f"{len(planned)} requests, open loop")
    sent = asyncio.run(client.run(route.base, p.fleet["model"], planned, route.api_key))
    # Right after the load, while its connections are still there to be counted.
    attempt.add_artifact(f"network-{rate:g}.json", network_snapshot(route.host, rate))
    drain(route.base)
    time.sleep(0.5)  # the router's journal writer flushes every 0.1 s
    rows, unreadable = journal_rows(journal_since(route.host, route.rh, offset), tag)
    rec = reconcile_rows([x.request_id for x in planned], rows, unreadable)
    snapshot = scrape(route.prometheus)
    state = _get_json(f"{route.base}/narwhal/state") or {}
    out_now = {str(e.get("id")) for e in state.get("engines", [])
               if not e.get("admitted") or e.get("held_reason")}
    attempt.add_json(f"{name}-router-state.json", state)
    summary = summarise(rate, sent.records, sent.seconds, float(slo["ttft_s"]),
                        float(slo["tpot_s"]))
    summary.update(drained_before_s=round(waited, 3), client_cpu_share=round(sent.cpu_share, 3),
                   connection_budget=sent.budget, reconciled=rec.as_dict(),
                   scrape=snapshot or {"error": "Prometheus did not answer"},
                   router_engines=[{k: e.get(k) for k in (
                       "id", "admitted", "ejected_reason", "ejections", "held_reason")}
                       for e in state.get("engines", [])], **(noted or {}))
    if (cache := cache_totals(rows)) is not None:
        summary["router_cache"] = cache
    if (continued := continuation_totals(rows)) is not None:
        summary["continued"] = continued
    summary["verdict"] = verdict(summary, rec.ok,
                                 scrape_holds(snapshot, len(p.targets()), out_now))
    summary = RateSummary.model_validate(summary).document()  # refused here if misshapen
    attempt.add_artifact(f"{name}-records.jsonl", client.records_jsonl(sent.records))
    attempt.add_artifact(f"{name}-journal.jsonl", b"".join(
        canonical_json(r).encode() + b"\n" for r in rows))
    attempt.add_json(f"{name}-summary.json", summary)
    progress(f"rate {rate:g}/s", f"{summary['verdict']}: attainment "
             f"{summary['attainment']:.0%}, goodput {summary['goodput_per_s']}/s, "
             f"reconciled {rec.ok}, client-limited {summary['client_limited']}")
    return summary, report.RateData(summary, [r.as_dict() for r in sent.records], rows)


def fabric_heatmap(attempt: Attempt) -> bytes | None:
    """Gate D's heatmap from its last passed attempt, if the record holds one."""
    entry = attempt.ledger.load()["gates"].get("fabric", {})
    if entry.get("state") != "passed" or not entry.get("last"):
        return None
    path = attempt.ledger.attempt_folder("fabric", str(entry["last"])) / "edge-matrix.png"
    return path.read_bytes() if path.is_file() else None


def record_spans(attempt: Attempt) -> list[report.AttemptSpan]:
    """Every finished attempt of the record, for the report's timeline."""
    doc = attempt.ledger.load()
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for table in ("gates", "activities"):
        for step, entry in doc.get(table, {}).items():
            for attempt_id in entry.get("attempts", []):
                path = attempt.ledger.attempt_folder(step, attempt_id) / "attempt.json"
                try:
                    found[(step, attempt_id)] = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
    started = float(attempt.start_doc["started_epoch"])
    return [*report.spans_from(doc, found),
            report.AttemptSpan(ACTIVITY, attempt.id, started, time.time() - started, "running")]
