"""Gate F on the lab: `narwhal preflight` after Gates C, D and E, from the workstation namespace.

Both tools run on the router host over its session (host `router` in commands.jsonl): the
profile store is written once per engine generation, and narwhal-check proves every ordered
pair's KV handoff and the contract against Gate C's captures (not SKIP).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.browser import render
from tests.lab import canary_drill as cd
from tests.lab import continuation_drill as contd
from tests.lab.fleet_up import GATE_ARGS, through
from tests.lab.installing import Installer, rows
from tests.lab.operator import NARWHAL
from tests.lab.record_files import MANIFEST, first_passed_files

from narwhal.deploy.gates import monitoring
from narwhal.lab import lifecycle
from narwhal.lab.faults import Faults
from narwhal.lab.testing import ssh

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]
ENGINES = ["engine-1", "engine-2", "engine-3"]
PAIRS = {f"{a}->{b}" for a in ENGINES for b in ENGINES if a != b}
# The live KV canary drill's pair: engine-2 decodes what it pulls from engine-1 wrong
PRODUCER, CONSUMER = "engine-1", "engine-2"
CANARY_PAIR = f"{PRODUCER}->{CONSUMER}"
PAIRS_BY_HOST = {f"node-{a}->node-{b}" for a in (1, 2, 3) for b in (1, 2, 3) if a != b}
# What deploy does after one engine changed (the runbook's engine-restart row): that engine's
# capture, attestation and profile, full preflight and the router; the fabric kept.
ENGINE_WORK = {"discover": "kept", "install": "kept", "engines": "ran", "fabric": "kept",
               "attest": "ran", "preflight": "ran", "serve": "ran"}


@pytest.fixture(scope="module")
def attested(installer: Installer) -> Iterator[Installer]:
    with through(installer, "engines", "fabric", "attest") as fleet:
        yield fleet


def _tool_rows(attempt: Path, tool: str) -> list[dict[str, Any]]:
    return [r for r in rows(attempt) if r["argv"] and str(r["argv"][0]).endswith(tool)]


def _verdicts(evidence: dict[str, Any], gate: str) -> dict[str, str]:
    return {v["subject"]: v["status"] for v in evidence["verdicts"] if v["gate"] == gate}


def test_preflight_profiles_each_generation_once_and_proves_every_pair_and_the_contract(
        attested: Installer) -> None:
    op = attested.op
    code, doc = op.json_command("preflight")
    assert code == 0 and doc["verdict"] == "passed", doc
    first = op.last_attempt("preflight")
    profile_runs = _tool_rows(first, "narwhal-profile")
    check_runs = _tool_rows(first, "narwhal-check")
    assert len(profile_runs) == 1 and check_runs
    assert {r["host"] for r in profile_runs + check_runs} == {"router"}
    evidence = json.loads((first / "check-full.json").read_text())
    assert _verdicts(evidence, "kv") == {p: "pass" for p in PAIRS}
    contract = _verdicts(evidence, "contract")
    assert set(contract) >= set(ENGINES) | PAIRS
    assert set(contract.values()) == {"pass"}  # held to Gate C's captures, not SKIP
    # the lab's .env turns KV events on: every engine publishes, the router's index fed by
    # them predicts each engine's own hits, and the router host has the checkpoint's tokenizer
    assert _verdicts(evidence, "events") == {e: "pass" for e in ENGINES}
    placed = json.loads((first / "fleet.json").read_text())
    assert placed["prefix_cache"] == {"tokenizer_dir": "tokenizer"}
    assert all(e["kv_events"]["endpoint"].startswith("tcp://") for e in placed["engines"])
    kept = json.loads((op.last_attempt("discover") / "router-tokenizer.json").read_text())
    listed = _on_router(attested, f"sha256sum {_router_folder(attested)}/tokenizer/*")
    assert {line.split()[1].rsplit("/", 1)[1]: line.split()[0]
            for line in listed.splitlines()} == kept["files"]
    fleet = json.loads((op.last_attempt("attest") / "fleet.json").read_text())
    attested_digest = {e["id"]: e["contract"]["attestation_digest"] for e in fleet["engines"]}
    store = json.loads((first / "profiles.json").read_text())
    assert {r["engine_id"]: r["generation"]["attestation_digest"] for r in store["profiles"]} \
        == attested_digest  # each row bound to the attested process

    calibration = json.loads((first / "first-token-calibration.json").read_text())
    assert doc["first_token_candidate_s"] == calibration["candidate_s"] > 0
    final = json.loads((first / "fleet-calibrated.json").read_text())
    assert final["calibration"] == {"path": "first-token-calibration.json"}
    deadline = final.get("serving", {}).get("first_token_timeout_s", 60.0)
    assert calibration["candidate_s"] <= deadline

    code, doc = op.json_command("preflight")
    assert code == 0 and doc["verdict"] == "passed", doc
    second = op.last_attempt("preflight")
    assert second != first
    assert _tool_rows(second, "narwhal-profile") == []  # every row still binds: none profiled
    assert (second / "profiles.json").read_bytes() == (first / "profiles.json").read_bytes()
    assert json.loads((second / "check-generations.json").read_text())["ok"] is True


def _on_router(fleet: Installer, command: str) -> str:
    return ssh(fleet.op.plan, fleet.lab_host("router"), command).stdout.strip()


def _router_folder(fleet: Installer) -> str:
    """Where Gates F and G keep the fleet the router reads, on the router host."""
    plan = json.loads((fleet.op.last_attempt("install") / "plan.json").read_text())
    return f"{fleet.remote}/runs/{plan['prepared_run']}/router"


def test_serve_leaves_the_router_and_prometheus_running_and_a_second_serve_adopts(
        attested: Installer) -> None:
    op = attested.op
    code, doc = op.json_command("serve")
    assert code == 0 and doc["verdict"] == "passed", doc
    assert doc["router"] == "started"
    assert doc["tunnel"]["ready"] == 200 and doc["tunnel"]["completion"] == 200
    assert len(doc["up"]) == 1 + 2 * len(ENGINES) and set(doc["up"].values()) == {"1"}
    assert all(n > 0 for n in doc["panels"].values()), doc["panels"]
    router_pid, prometheus_pid = doc["pid"], doc["prometheus_pid"]
    for pid in (router_pid, prometheus_pid):  # alive after the command exited
        assert _on_router(attested, f"kill -0 {pid} && echo alive") == "alive"
    journal = _on_router(attested, f"grep -c {doc['tunnel']['request_id']} "
                                   f"{_router_folder(attested)}/journal.jsonl")
    assert journal == "1"  # the private path's completion, journalled once

    code, again = op.json_command("serve")
    assert code == 0 and again["verdict"] == "passed", again
    assert again["router"] == "adopted"  # never a second controller
    assert _on_router(attested, "pgrep -c -f 'bin/narwhal-serve --fleet'") == "1"
    assert _on_router(attested, f"kill -0 {router_pid} && echo alive") == "alive"
    assert again["prometheus_pid"] != prometheus_pid  # the earlier one was replaced
    assert _on_router(attested, f"kill -0 {prometheus_pid} 2>/dev/null || echo gone") == "gone"
    rules = (op.last_attempt("serve") / "monitoring-rules.json").read_text()
    assert "NarwhalEngineDown" in rules and "NarwhalLeaseChanged" in rules


# Credentials end to end (the lab deploys with NARWHAL_ROUTER_API_KEY and NARWHAL_ENGINE_KEY,
# tests/lab/installing.py), tried from the router host as a client would while Gate G's
# router runs. The calls that send a key read it on the host from the file Gate B placed
# there, so the test itself puts no key in an argv.
# Run on a lab host: POST one completion to argv[1], with the bearer key read from the file
# argv[2] ("-" for none); print the HTTP status.
CALL = """import json, sys, urllib.error, urllib.request
url, key_file, model = sys.argv[1:4]
headers = {"Content-Type": "application/json"}
if key_file != "-":
    headers["Authorization"] = "Bearer " + open(key_file).read().strip()
body = json.dumps({"model": model, "prompt": "the sea", "max_tokens": 2}).encode()
try:
    print(urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers),
                                 timeout=30).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""
# Run on a lab host: every file under argv[2:] (secrets/ folders left out) that holds a key
# read from the files under argv[1]; one path per line.
SCAN = """import os, sys
keys = set()
for base, _, names in os.walk(sys.argv[1]):
    for n in names:
        keys.add(open(os.path.join(base, n), "rb").read().strip())
keys.discard(b"")
for root in sys.argv[2:]:
    for base, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "secrets"]
        for n in names:
            p = os.path.join(base, n)
            try:
                data = open(p, "rb").read()
            except OSError:
                continue
            if any(k in data for k in keys):
                print(p)
"""




# Run on the router host: two turns of one conversation through the router (argv[1] its base
# URL, the tenant key read from the file argv[2]), then print the router's prefix_cache state.
CHAT = """import json, sys, time, urllib.request
base, key_file, model = sys.argv[1:4]
headers = {"Content-Type": "application/json",
           "Authorization": "Bearer " + open(key_file).read().strip()}
def post(messages):
    body = json.dumps({"model": model, "messages": messages, "max_tokens": 4}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers=headers)
    return json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"]
first = [{"role": "user", "content": " ".join("the sea and the land" for _ in range(80))}]
answer = post(first)
time.sleep(1.0)
post(first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then"}])
state = json.load(urllib.request.urlopen(base + "/narwhal/state", timeout=30))
print(json.dumps(state["prefix_cache"]))
"""


def _put_scripts(fleet: Installer, host: str) -> None:
    for name, text in (("narwhal-call.py", CALL), ("narwhal-scan.py", SCAN),
                       ("narwhal-chat.py", CHAT)):
        done = ssh(fleet.op.plan, host, f"cat > /tmp/{name} <<'PY'\n{text}PY")
        assert done.returncode == 0, done.stderr


def _call(fleet: Installer, host: str, url: str, key_file: str) -> int:
    _put_scripts(fleet, host)
    done = ssh(fleet.op.plan, host, f"python3 /tmp/narwhal-call.py {url} {key_file} "
                                    f"{fleet.op.plan.spec.model.name}", timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_the_router_serves_only_requests_with_the_tenant_key(attested: Installer) -> None:
    """The fleet Gate G serves names the tenant key and the engines' key by their 0600
    files; the router refuses a client without the tenant key and serves one with it."""
    fleet = json.loads((attested.op.last_attempt("preflight") / "fleet-calibrated.json")
                       .read_text())
    assert fleet["tenants"] == [{"name": "default",
                                 "key_file": "../secrets/NARWHAL_ROUTER_API_KEY"}]
    assert fleet["engine_auth"] == {"key_file": "../secrets/NARWHAL_ENGINE_KEY"}
    router, secrets_dir = attested.lab_host("router"), attested.secrets_dir()
    url = "http://127.0.0.1:8000/v1/completions"
    assert _call(attested, router, url, "-") == 401
    assert _call(attested, router, url, f"{secrets_dir}/NARWHAL_ENGINE_KEY") == 401
    assert _call(attested, router, url, f"{secrets_dir}/NARWHAL_ROUTER_API_KEY") == 200


def test_the_router_follows_every_engine_s_kv_events_and_places_the_next_turn_on_them(
        attested: Installer) -> None:
    """Gate G's router, fed by the engines' KV events over the lab fabric and tokenizing with
    the checkpoint's files Gate F placed, predicts a hit for a conversation's second turn."""
    router, secrets_dir = attested.lab_host("router"), attested.secrets_dir()
    _put_scripts(attested, router)
    done = ssh(attested.op.plan, router, f"python3 /tmp/narwhal-chat.py http://127.0.0.1:8000 "
               f"{secrets_dir}/NARWHAL_ROUTER_API_KEY {attested.op.plan.spec.model.name}",
               timeout=120)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)
    engines = state["engines"]
    assert {e["mode"] for e in engines.values()} == {"events"}, engines
    assert sum(e["events"]["batches"] for e in engines.values()) > 0, engines
    assert all(e["events"]["refused"] == e["events"]["gaps"] == 0 for e in engines.values())
    assert state["blind_requests"] == 0 and sum(state["decisions"].values()) >= 2, state
    assert sum(state["predicted_hit_tokens"].values()) > 0, state


@dataclass(frozen=True)
class _Drill:
    """Where the canary drill reads and acts, from the fleet Gate G serves."""

    base: str  # the router, as its host reaches it
    prometheus: str
    journal: str
    period: float  # the fleet's kv_canary.interval_s
    release_after: int
    consumer_url: str
    peer: str  # the producer's NIXL side channel, as the consumer's pulls name it


def _served_plan(fleet: Installer) -> dict[str, Any]:
    """Gate G's plan, its router answering: Gate G is run first when it has not run or its
    router does not answer (this test run without the ones before it)."""
    if "serve" in _attempts(fleet.op):
        plan = json.loads((fleet.op.last_attempt("serve") / "plan.json").read_text())
        answer = _on_router(fleet, f"curl -s -o /dev/null -w '%{{http_code}}' "
                                   f"{plan['router_url']}/narwhal/state")
        if answer == "200":
            return dict(plan)
    code, doc = fleet.op.json_command("serve")
    assert code == 0, doc
    return dict(json.loads((fleet.op.last_attempt("serve") / "plan.json").read_text()))


def _drill(fleet: Installer) -> _Drill:
    """Where the drill reads and acts, and the canary's settings as Gate F wrote them."""
    plan = _served_plan(fleet)
    folder = _router_folder(fleet)
    served = json.loads(_on_router(fleet, f"cat {folder}/fleet.json"))
    # Gate F wrote the lab .env's NARWHAL_KV_CANARY_INTERVAL_S beside the reference
    assert served["kv_canary"] == {"path": "kv-canary.json", "interval_s": 3.0}, served
    record = json.loads((fleet.op.last_attempt("discover") / f"launch-{PRODUCER}.json")
                        .read_text())
    return _Drill(plan["router_url"], plan["prometheus_url"], f"{folder}/journal.jsonl",
                  served["kv_canary"]["interval_s"],
                  int(served["kv_canary"].get("release_after", 3)),
                  next(e["url"] for e in served["engines"] if e["id"] == CONSUMER),
                  f"{record['fabric_address']}:{record['ports']['nixl_side_channel']}")


def _held(fleet: Installer, d: _Drill) -> list[str]:
    return [k for k, p in cd.canary_state(fleet, d.base)["pairs"].items() if p["held"]]


def _caught_alone(fleet: Installer, d: _Drill, faulted_at: float) -> dict[str, Any]:
    """The pair held within two periods, its evidence the wrong answer; every other pair
    probed since and none of them held."""
    def held() -> dict[str, Any] | None:
        got = cd.canary_state(fleet, d.base)["pairs"].get(CANARY_PAIR, {})
        return got if got.get("held") else None

    pair = cd.until(f"{CANARY_PAIR} held", held, 2 * d.period + 5, every=0.1)
    assert pair["held_since"] - faulted_at <= 2 * d.period, (faulted_at, pair)
    assert pair["verdict"] == "mismatch" and "the reference is" in pair["evidence"], pair

    def others_probed() -> dict[str, Any] | None:
        pairs = cd.canary_state(fleet, d.base)["pairs"]
        return pairs if all(pairs.get(k, {}).get("last_probe_at", 0) > pair["held_since"]
                            for k in PAIRS - {CANARY_PAIR}) else None

    pairs = cd.until("every other pair probed again", others_probed, 2 * d.period + 5)
    assert [k for k, p in pairs.items() if p["held"]] == [CANARY_PAIR], pairs
    return pair


def _placed(rows: list[dict[str, Any]]) -> Counter[str]:
    """How rows were placed: `prefill->decode` per split request, `single engine` otherwise."""
    return Counter(f"{r['prefill_engine']}->{r['decode_engine']}" if r["mode"] == "split"
                   else f"single {r['decode_engine']}" for r in rows)


def _no_request_over_the_pair(fleet: Installer, d: _Drill, since: float) -> Counter[str]:
    """Client streams after detection, four at once: every one 200 and whole, none split
    over the held pair (the journal's engines per request), its consumer still serving. How
    the requests since were placed, returned. (At the lab's load the curve scheduler runs
    nearly every request whole on one engine: a split is priced only where the TPOT budget
    needs it; tests/component/serve/test_kv_canary.py splits over every pair.)"""
    sent = cd.streams(fleet, d.base, "canary-after", 12, 4, 24)
    assert sorted(s[1:] for s in sent) == [[200, True]] * 12, sent

    def journalled() -> list[dict[str, Any]] | None:
        rows = cd.journal_rows(fleet, d.journal, "canary-after-")
        return rows if len(rows) == 12 else None

    assert all(r["outcome"] == "ok" for r in cd.until("12 rows journalled", journalled, 10))
    placed = _placed([r for r in cd.journal_rows(fleet, d.journal, "canary-")
                      if r["received_at"] > since])
    assert placed[CANARY_PAIR] == 0, placed
    assert any(k.endswith(f"->{CONSUMER}") or k == f"single {CONSUMER}" for k in placed), placed
    return placed


def _alert_fires(fleet: Installer, d: _Drill, faulted_at: float) -> float:
    """NarwhalKvPairHeld firing in the lab Prometheus for that pair alone: seconds from the
    fault to its activeAt (held, then one scrape and one rule evaluation)."""
    def firing() -> list[dict[str, Any]] | None:
        alerts = cd.kv_pair_alerts(fleet, d.prometheus)
        return alerts if any(a["state"] == "firing" for a in alerts) else None

    margin = 2 * monitoring.SCRAPE_INTERVAL_S  # scrape, then evaluation (both every 5 s)
    alerts = cd.until("NarwhalKvPairHeld firing", firing, 2 * d.period + margin + 5)
    assert [(a["labels"]["producer"], a["labels"]["consumer"], a["state"]) for a in alerts] \
        == [(PRODUCER, CONSUMER, "firing")], alerts
    fired_s = cd.rfc3339(alerts[0]["activeAt"]) - faulted_at
    assert fired_s <= 2 * d.period + margin, alerts
    return fired_s


def test_a_corrupt_kv_pair_is_held_alone_within_two_canary_periods_and_serves_no_request(
        attested: Installer) -> None:
    """Issue 41: engine-2 decodes the KV it pulls from engine-1 as another request's (the
    emulator's corrupt_pulls: HTTP 200, wrong tokens). Within two canary periods the router
    holds that pair alone, `narwhal status` names it with its evidence, the lab Prometheus
    fires NarwhalKvPairHeld for it, and no client request sent afterwards is split over it.
    Cleared, the pair is released after `release_after` passes and the alert resolves, so the
    tests after this one find a healthy fleet."""
    d = _drill(attested)
    with cd.Load(attested, d.base, "canary-load"):
        assert _held(attested, d) == []
        faulted_at = time.time()
        try:
            faults = cd.corrupt_pulls(attested, d.consumer_url, d.peer)
            assert faults["corrupt_pulls_from"] == d.peer, faults
            pair = _caught_alone(attested, d, faulted_at)
            placed = _no_request_over_the_pair(attested, d, pair["held_since"])
            code, doc = attested.op.json_command("status")
            assert code == 0, doc
            assert [(p["pair"], p["verdict"]) for p in doc["kv_pairs_held"]] == [
                (CANARY_PAIR, "mismatch")], doc["kv_pairs_held"]
            assert "the reference is" in doc["kv_pairs_held"][0]["evidence"]
            fired_s = _alert_fires(attested, d, faulted_at)
        finally:
            cleared = cd.corrupt_pulls(attested, d.consumer_url, None)
        assert cleared["corrupt_pulls_from"] is None, cleared
        cd.until(f"{CANARY_PAIR} released", lambda: _held(attested, d) == [],
                 (d.release_after + 2) * d.period + 5)
    cd.until("NarwhalKvPairHeld resolved", lambda: not cd.kv_pair_alerts(attested, d.prometheus),
             2 * monitoring.SCRAPE_INTERVAL_S + 5)
    cost = cd.canary_state(attested, d.base)
    print(f"kv canary drill: held {pair['held_since'] - faulted_at:.2f} s and the alert "
          f"firing {fired_s:.2f} s after the fault (period {d.period:g} s); placed while "
          f"held: {dict(placed)}; cost: {cost['probes']} probes, {cost['probes_per_hour']} "
          f"an hour, engine time share {cost['engine_time_share']}")


def _stall_bound_s(served: dict[str, Any]) -> float:
    """The longest a stopped engine's stream may wait for its next event: the stall deadline
    at the fleet's TPOT objective (placement admits no stream predicted slower), then the
    continuation's own prefill and first token, allowed 3 s on this shared machine."""
    serving, slo = served.get("serving", {}), served["slo"]
    stall = max(float(serving.get("stall_floor_s", 2.0)),
                int(serving.get("stall_steps", 50)) * float(slo["tpot_s"]))
    return min(stall, float(serving.get("stream_idle_timeout_s", 60.0))) + 3.0


def test_a_stopped_engine_s_streams_continue_elsewhere_with_the_unfaulted_text(
        attested: Installer) -> None:
    """Issue 41: under greedy streams from three clients, engine-3's process is stopped
    (SIGSTOP) while it decodes. Every stream completes with 200, its whole answer and [DONE];
    the streams it was decoding continue on another engine within the stall deadline, and
    each answer is the text the same question gets once the engine runs again (the unfaulted
    fleet); after SIGCONT nothing of the stopped engine reaches any client, and the router
    admits engine-3 again."""
    d = _drill(attested)
    served = json.loads(_on_router(attested, f"cat {_router_folder(attested)}/fleet.json"))
    url = next(e["url"] for e in served["engines"] if e["id"] == "engine-3")
    contd.put_greedy(attested)
    tokens, count = 96, 9
    load = contd.Greedy(attested, d.base, "stopped", count, 3, tokens).start()
    pid = contd.engine_pid(attested, "eng3")
    try:
        contd.until_decoding(attested, url, 30)
        contd.signal_engine(attested, "eng3", pid, "STOP")
        answers = load.join(180)
    finally:
        contd.signal_engine(attested, "eng3", pid, "CONT")
    time.sleep(2.0)  # the stopped engine runs on: what it still had to send reaches nobody
    replayed = contd.greedy(attested, d.base, "replayed", 0, count, 3, tokens)
    assert sorted(answers) == list(range(count)), answers
    for n, got in answers.items():
        assert (got["status"], got["done"], got["error"], got["tokens"]) == (
            200, True, None, tokens), got
        assert got["text"] == replayed[n]["text"], (got, replayed[n])
    rows = {r["request_id"]: r for r in cd.journal_rows(attested, d.journal, "stopped-")}
    moved = {rid: r["continued"] for rid, r in rows.items() if r.get("continued")}
    assert moved, "no stream engine-3 was decoding was continued"
    assert all(step["from"] == "engine-3" and step["to"] != "engine-3" and step["exact"]
               for steps in moved.values() for step in steps), moved
    assert all(rows[rid]["outcome"] == "ok" for rid in moved), rows
    worst = max(answers[int(rid.rsplit("-", 1)[1])]["gap"] for rid in moved)
    assert worst <= _stall_bound_s(served), (worst, served.get("serving"))
    print(f"continuation drill: {len(moved)} of {count} streams continued after engine-3 "
          f"stopped; worst wait between two events {worst:.2f} s")

    def admitted() -> bool:
        state = json.loads(_on_router(attested, f"curl -s {d.base}/narwhal/state"))
        return all(e["admitted"] for e in state["engines"])

    cd.until("engine-3 admitted again", admitted, 60)


def test_an_engine_reached_from_the_router_host_needs_the_engine_key(
        attested: Installer) -> None:
    record = json.loads((attested.op.last_attempt("discover") / "launch-engine-1.json")
                        .read_text())
    url = f"http://{record['fabric_address']}:{record['ports']['engine']}/v1/completions"
    router, secrets_dir = attested.lab_host("router"), attested.secrets_dir()
    assert _call(attested, router, url, "-") == 401
    assert _call(attested, router, url, f"{secrets_dir}/NARWHAL_ROUTER_API_KEY") == 401
    assert _call(attested, router, url, f"{secrets_dir}/NARWHAL_ENGINE_KEY") == 200


def test_each_attestation_names_the_kv_path_gate_d_measured(attested: Installer) -> None:
    """The path an engine moves KV on (UCX_TLS, UCX_NET_DEVICES) is in its attestation, and
    is the one each of its host's links was measured with."""
    links = json.loads((attested.op.last_attempt("fabric") / "links.json").read_text())
    for n in (1, 2, 3):
        doc = json.loads((attested.op.last_attempt("attest") / f"attestation-engine-{n}.json")
                         .read_text())
        path = doc["transfer"]["path"]
        assert path["transport"] == "ucx_tcp" and path["tls"][0] == "tcp", path
        ends = [link["transport"][end]["ucx"] for link in links.values()
                for end, host in (("source", link["source"]),
                                  ("destination", link["destination"]))
                if host == f"node-{n}"]
        assert ends and all(e["UCX_NET_DEVICES"] == ",".join(path["net_devices"])
                            for e in ends), (path, ends)


def test_no_key_is_in_any_argv_record_or_host_log(attested: Installer) -> None:
    keys = (attested.router_key.encode(), attested.engine_key.encode())
    plan, secrets_dir = attested.op.plan, attested.secrets_dir()
    for alias in ("router", "engine-1", "engine-2", "engine-3"):
        host = attested.lab_host(alias)
        argvs = ssh(plan, host, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; "
                    "done 2>/dev/null", timeout=60).stdout.encode()
        assert argvs and not any(k in argvs for k in keys), host
        _put_scripts(attested, host)
        found = ssh(plan, host, f"python3 /tmp/narwhal-scan.py {secrets_dir} "
                    f"{attested.remote} {plan.spec.run_dir} /tmp", timeout=120).stdout.strip()
        assert not found, (host, found.splitlines()[:10])
        mode = ssh(plan, host, f"stat -c %a {secrets_dir}/NARWHAL_ENGINE_KEY").stdout.strip()
        assert mode == "600", (host, mode)
    leaked = [p for p in attested.op.runs.rglob("*")
              if p.is_file() and any(k in p.read_bytes() for k in keys)]
    assert not leaked, leaked[:10]
    local = subprocess.run(["sh", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' "
                            "< $f; echo; done 2>/dev/null"], capture_output=True, check=False)
    assert not any(k in local.stdout for k in keys)



def _attempts(op: Any) -> dict[str, list[str]]:
    doc = json.loads((op.runs / "lab" / "ledger.json").read_text())
    return {g: list(e["attempts"]) for g, e in doc["gates"].items()}


def test_deploy_keeps_every_gate_that_is_passed_and_fresh(attested: Installer) -> None:
    op = attested.op
    before = _attempts(op)
    code, doc = op.json_command("deploy")
    assert code == 0 and doc["verdict"] == "passed", doc
    assert [(s["letter"], s["action"]) for s in doc["steps"]] == [(g, "kept") for g in "ABCDEFG"]
    assert _attempts(op) == before  # no gate ran
    assert {r["state"] for r in doc["status"]} == {"passed"}


def test_every_gate_s_record_holds_the_files_a_deploy_left_before_gates_were_functions(
        attested: Installer) -> None:
    """The record's shape is the operator's: each gate's first pass on this lab (hand runs and
    deploy call the same functions) holds exactly the files `make demo`'s deploy left in each
    attempt before the refactor (tests/lab/deploy_record_files.json; command outputs under
    out/ aside, whose count depends on polls)."""
    expected = json.loads(MANIFEST.read_text())
    assert first_passed_files(attested.op.runs / "lab") == expected


def test_a_moved_workload_inside_the_profiled_range_re_judges_the_fabric_alone(
        attested: Installer) -> None:
    """The runbook's row "Offered rate or request count within the profiled workload range":
    keep the engine profiles, fabric samples and full preflight. A new prompt length moves
    Gate D's budget, so `status` names Gate D alone, saying every saved sample meets the new
    budget and Gate F is kept; deploy runs Gate D, which measures nothing, and keeps E, F and
    G. Beyond the range measured, `status` names Gate F's rows to profile again, each with
    its range."""
    op = attested.op
    store = json.loads((op.last_attempt("preflight") / "profiles.json").read_text())
    longest = {r["engine_id"]: r["prefill"]["max_prompt_tokens"] for r in store["profiles"]}
    inside = op.variant("workload-inside",
                        NARWHAL_WORKLOAD_PROMPT_TOKENS=str(min(longest.values())))
    code, doc = op.json_command("status", "--offline", env=inside)
    assert code == 0, doc
    gates = {r["gate"]: r for r in doc["gates"]}
    assert {g: r["state"] for g, r in gates.items() if r["state"] != "passed"} == {
        "fabric": "stale"}, doc["gates"]
    assert gates["fabric"]["repeat"] == ["fabric"], gates["fabric"]
    assert "workload" in gates["fabric"]["reason"]
    assert "none measured" in gates["fabric"]["reason"], gates["fabric"]
    assert "Gate F kept" in gates["fabric"]["reason"], gates["fabric"]

    beyond = max(longest.values()) + 1
    code, doc = op.json_command("status", "--offline", env=op.variant(
        "workload-beyond", NARWHAL_WORKLOAD_PROMPT_TOKENS=str(beyond)))
    gates = {r["gate"]: r for r in doc["gates"]}
    assert {g: r["state"] for g, r in gates.items() if r["state"] != "passed"} == {
        "fabric": "stale", "preflight": "stale", "serve": "stale"}, doc["gates"]
    reason = gates["preflight"]["reason"]
    assert all(f"{e} (measured up to {n} of {beyond} tokens)" in reason
               for e, n in longest.items()), reason

    # Deploy the covered one, then the workload of before: Gate D each time, measuring nothing
    for env in (inside, op.env):
        before = _attempts(op)
        code, doc = op.json_command("deploy", env=env)
        assert code == 0 and doc["verdict"] == "passed", doc
        ran = [s["gate"] for s in doc["steps"] if s["action"] == "ran"]
        assert ran == ["fabric"], doc["steps"]
        after = _attempts(op)
        assert {g for g in after if len(after[g]) > len(before[g])} == {"fabric"}
        clients = [r for r in rows(op.last_attempt("fabric"))
                   if r["argv"][:2] == ["iperf3", "--client"]]
        assert clients == []  # every edge's sample reused, re-judged
        assert {r["state"] for r in doc["status"]} == {"passed"}, doc["status"]


def test_an_edited_slo_makes_deploy_rerun_preflight_and_serve_only(attested: Installer) -> None:
    """The runbook's row "SLO or first-token deadline": the slo and calibration gates against
    the saved profiles, then the router on the edited fleet; nothing before Gate F."""
    op = attested.op
    router = _owned(attested, "serve", "router")
    before = _attempts(op)
    edited = op.variant("edited-slo", NARWHAL_TTFT_S="20")
    code, doc = op.json_command("deploy", env=edited)
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert [g for g, s in steps.items() if s["action"] == "ran"] == ["preflight", "serve"]
    assert "slo" in steps["preflight"]["why"]
    after = _attempts(op)
    assert {g: len(after[g]) - len(before[g]) for g in after} == {
        "discover": 0, "install": 0, "engines": 0, "fabric": 0, "attest": 0, "preflight": 1,
        "serve": 1}
    preflight = op.last_attempt("preflight")
    assert _tool_rows(preflight, "narwhal-profile") == []  # the saved profiles, kept
    assert _tool_rows(preflight, "narwhal-check")
    served = json.loads(_on_router(attested, f"cat {_router_folder(attested)}/fleet.json"))
    assert served["slo"]["ttft_s"] == 20
    # the router reads its fleet once: the one started on the old fleet was replaced
    assert steps["serve"]["output"]["router"] == "started"
    assert _on_router(attested, f"kill -0 {router['pid']} 2>/dev/null || echo gone") == "gone"
    assert _on_router(attested, "pgrep -c -f 'bin/narwhal-serve --fleet'") == "1"

    code, doc = op.json_command("deploy")  # the edit undone: the same two gates again
    assert code == 0, doc
    assert [s["gate"] for s in doc["steps"] if s["action"] == "ran"] == ["preflight", "serve"]


def test_a_trial_reconciles_every_request_with_the_journal_and_drains_between_rates(
        attested: Installer) -> None:
    """Also the runbook's row "Offered rate or request count": a new rate is the trial alone;
    the profiles, the fabric samples and the preflight are kept (no gate attempt added)."""
    op = attested.op
    before = _attempts(op)
    code, doc = op.json_command("trial", "--rates", "2,4", "--requests", "40")
    assert code == 0, doc
    assert _attempts(op) == before
    assert [r["rate"] for r in doc["rates"]] == [2.0, 4.0]
    for r in doc["rates"]:
        rec = r["reconciled"]
        assert rec["ok"] and rec["sent"] == rec["journalled"] == 40, rec
        assert r["verdict"] in ("within SLO", "capacity miss"), r
        assert r["ok"] == 40 and r["ttft_p50_s"] is not None
        assert r["scrape"]["up"] and set(r["scrape"]["up"].values()) == {"1"}
    attempt = op.runs / "lab" / "load-trial" / doc["attempt"]
    records = (attempt / "rate-4-records.jsonl").read_text().splitlines()
    assert len(records) == 40 and all(json.loads(x)["status"] == 200 for x in records)
    journal = (attempt / "rate-4-journal.jsonl").read_text().splitlines()
    assert len(journal) == 40  # this rate's rows only: read from where the journal stood
    assert "drained_before_s" in doc["rates"][1]  # the second rate waited for the first's tail
    _assert_trial_network_evidence(attempt, [2.0, 4.0])

    # The report, as the operator's team opens it: offline, every picture loaded.
    assert doc["report"] == str(attempt / "report.html")
    shown = render(attempt / "report.html", "#verdict")
    verdicts = [f"{r['rate']:g}/s {r['verdict']}" for r in doc["rates"]]
    assert all(v in shown.text for v in verdicts), shown.text
    # attainment, latency, engine load, Gate D's heatmap and the gate timeline
    assert [i["src"] for i in shown.images] == [
        "report-attainment.png", "report-latency.png", "report-engine-load.png",
        "report-fabric.png", "report-timeline.png"]
    assert all(i["complete"] and i["width"] > 300 for i in shown.images), shown.images
    assert (attempt / "report-fabric.png").read_bytes() == (
        op.last_attempt("fabric") / "edge-matrix.png").read_bytes()


def _engine_prefix_hits(fleet: Installer) -> float:
    """The prompt tokens every engine says its prefix cache served, from its own /metrics."""
    total = 0.0
    for n in (1, 2, 3):
        record = json.loads((fleet.op.last_attempt("discover") / f"launch-engine-{n}.json")
                            .read_text())
        text = _on_router(fleet, f"curl -s http://{record['fabric_address']}:"
                                 f"{record['ports']['engine']}/metrics")
        total += sum(float(line.split()[-1]) for line in text.splitlines()
                     if line.startswith("vllm:prefix_cache_hits_total"))
    return total


def _conversation_trace(path: Path, users: int, turns: int) -> Path:
    """A Mooncake-format trace of `users` conversations of `turns` turns each, interleaved:
    every turn resends the whole conversation so far (its hash_ids) and adds two blocks."""
    rows = []
    for turn in range(turns):
        for user in range(users):
            ids = [1000 * user + k for k in range(2 + 2 * turn)]
            rows.append({"timestamp": 1000 * len(rows), "input_length": 512 * len(ids),
                         "output_length": 64, "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_trace_replays_its_repetition_and_the_router_places_turns_on_their_cache(
        attested: Installer) -> None:
    """`narwhal trial --trace`: the trace's timing and its repetition (equal hash_ids are equal
    prompt text) reach the fleet; the router's journal shows the hits it priced and the
    engines reported; the record names the trace by digest."""
    op = attested.op
    trace = _conversation_trace(op.env.with_name("conversation.jsonl"), users=3, turns=4)
    hits_before = _engine_prefix_hits(attested)
    code, doc = op.json_command("trial", "--rates", "4", "--trace", str(trace))
    assert code == 0, doc
    assert doc["trace"]["file"] == "conversation.jsonl"
    assert doc["trace"]["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    rate = doc["rates"][0]
    assert rate["reconciled"]["ok"] and rate["reconciled"]["sent"] == 12, rate["reconciled"]
    assert rate["ok"] == 12, rate
    reuse = rate["trace_reuse"]
    assert reuse["rows"] == 12 and reuse["repeated_block_share"] > 0.5, reuse
    cache = rate["router_cache"]
    assert cache["requests"] == 12 and cache["predicted_hit_tokens"] > 0, cache
    assert _engine_prefix_hits(attested) > hits_before  # the engines' own counters agree
    bad = trace.with_name("bad.jsonl")
    bad.write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]}\n')
    done = op.narwhal("trial", "--rates", "4", "--trace", str(bad))
    assert done.returncode == 2 and f"{bad}: line 2: input_length" in done.stderr, done.stderr


def _assert_trial_network_evidence(attempt: Path, rates: list[float]) -> None:
    """The tunnel log (the router's and Prometheus's forwards, each opened and cancelled, ok)
    and one network snapshot of the router host per rate are artifacts of the trial: listed
    with their sha256, 0600, the snapshot showing both forwarded listeners."""
    listed = json.loads((attempt / "attempt.json").read_text())["artifacts"]
    for name in ["tunnel.jsonl", *(f"network-{r:g}.json" for r in rates)]:
        data = (attempt / name).read_bytes()
        assert listed[name] == hashlib.sha256(data).hexdigest(), name
        assert (attempt / name).stat().st_mode & 0o777 == 0o600, name
    tunnel = [json.loads(x) for x in (attempt / "tunnel.jsonl").read_text().splitlines()]
    forwards = [r for r in tunnel if r["event"] in ("open", "cancel")]
    assert [(r["event"], r["ok"]) for r in forwards] == [("open", True)] * 2 + [
        ("cancel", True)] * 2, tunnel
    remotes = [r["remote"] for r in forwards[:2]]
    assert remotes[1] == "127.0.0.1:9090" and [r["remote"] for r in forwards[2:]] == remotes
    assert all(r["host"] == forwards[0]["host"] and r["transport"] == "ssh" for r in forwards)
    for rate in rates:
        snap = json.loads((attempt / f"network-{rate:g}.json").read_text())
        assert snap["rate"] == rate and snap["addresses"]["exit_status"] == 0, snap
        assert snap["routes"]["json"], snap["routes"]
        ports = {x["local"].rsplit(":", 1)[1] for x in snap["sockets"]["summary"]["listening"]}
        assert {"9090", remotes[0].rsplit(":", 1)[1]} <= ports, ports


def test_a_rate_the_client_cannot_schedule_is_client_saturated_never_capacity(
        attested: Installer) -> None:
    """The client is open loop (each request leaves at its time however many are in
    flight): 2,000/s for 120 requests is a rate it keeps, so a miss there is the fleet's. At
    10,000/s for 900 under a descriptor limit of 96 (a stated connection budget of 32) it
    runs out of its budget, or cannot open connections that fast: the verdict says the client,
    never capacity. (Without the lowered limit, a quiet machine kept 10,000/s for 900
    requests and the trial passed: whether the client saturates was the machine's load.)"""
    op = attested.op
    argv = [NARWHAL, "lab", "exec", "--", "prlimit", "--nofile=96:96", NARWHAL, "trial",
            "--rates", "10000", "--requests", "900", "--max-tokens", "4", "--json",
            "--env", str(op.env), "--runs", str(op.runs)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    try:
        code, doc = done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(done.stdout[-2000:] + done.stderr[-3000:]) from None
    assert code == 1 and "rates" in doc, doc
    [r] = doc["rates"]
    assert r["verdict"] in ("client saturated", "client-limited"), r
    assert r["late_sends"] > 45 or r["client_limited"] > 0 or r["client_cpu_share"] > 0.9, r


def _trial_while(fleet: Installer, fault: Any, *args: str) -> tuple[int, dict[str, Any]]:
    """`narwhal trial ARGS --json` with `fault()` done 4 s into it."""
    op = fleet.op
    argv = [NARWHAL, "lab", "exec", "--", NARWHAL, "trial", *args, "--json", "--env",
            str(op.env), "--runs", str(op.runs)]
    running = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4.0)
        fault()
        out, err = running.communicate(timeout=300)
    finally:
        if running.poll() is None:
            running.kill()
    try:
        return running.returncode, json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(out[-2000:] + err[-3000:]) from None


def _owned(fleet: Installer, gate: str, serves: str) -> dict[str, Any]:
    """The newest `serves` process any attempt of the gate started (its owned.jsonl row)."""
    found = [json.loads(line) for f in sorted((fleet.op.runs / "lab" / gate).glob(
        "*/owned.jsonl")) for line in f.read_text().splitlines()]
    return [r for r in found if r.get("serves") == serves][-1]


def test_prometheus_killed_mid_trial_is_a_scrape_failure_never_capacity(
        attested: Installer) -> None:
    op = attested.op
    code, doc = op.json_command("serve")  # whatever an earlier test left: running again
    assert code == 0, doc
    prometheus = _owned(attested, "serve", "prometheus")
    code, doc = _trial_while(attested, lambda: _on_router(
        attested, f"kill {prometheus['pid']}"), "--rates", "3", "--requests", "30")
    assert code == 1, doc
    [r] = doc["rates"]
    assert r["verdict"] == "scrape failure" and r["reconciled"]["ok"], r
    code, doc = op.json_command("serve")  # Prometheus back for what follows
    assert code == 0 and doc["router"] == "adopted", doc


def test_an_slo_below_the_profiled_decode_floor_fails_the_slo_gate(attested: Installer) -> None:
    op = attested.op
    tight = op.variant("tight-slo", NARWHAL_TPOT_S="0.0001")
    code, doc = op.json_command("preflight", env=tight)
    assert code == 1 and doc["verdict"] == "blocked", doc
    problems = {p["field"]: p for p in doc["problems"]}
    assert {f"slo {e} tpot_s" for e in ENGINES} <= set(problems), sorted(problems)
    assert "tpot_s 0.0001" in json.dumps(problems)
    served = json.loads(_on_router(attested, f"cat {_router_folder(attested)}/fleet.json"))
    assert served["slo"]["tpot_s"] != 0.0001  # the router's fleet is still the checked one


def test_a_restarted_engine_makes_deploy_redo_exactly_that_engines_work(
        attested: Installer) -> None:
    """The runbook's row "Engine process or attestation": capture, attestation and profile of
    that engine, then full preflight; the fabric only if its geometry moved (it did not)."""
    op = attested.op
    before = _attempts(op)
    ssh(op.plan, "eng2", "docker restart -t 5 $(docker ps -q)", timeout=60)
    code, doc = op.json_command("deploy")
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert {g: s["action"] for g, s in steps.items()} == ENGINE_WORK
    assert steps["engines"]["command"][:3] == ["narwhal", "engines", "--recapture"]
    assert steps["engines"]["command"][3] == "engine-2"
    after = _attempts(op)
    assert after["fabric"] == before["fabric"]
    summary = json.loads((op.last_attempt("attest") / "engine-attestation.json").read_text())
    assert {k: v["sidecar"] for k, v in summary["engines"].items()} == {
        "engine-1": "kept", "engine-2": "started", "engine-3": "kept"}
    [profiled] = _tool_rows(op.last_attempt("preflight"), "narwhal-profile")
    only = [profiled["argv"][i + 1] for i, a in enumerate(profiled["argv"]) if a == "--only"]
    assert only == ["engine-2"]  # the other rows still bind to their engines
    assert steps["serve"]["output"]["router"] == "started"  # on the fleet with the new digest
    code, doc = op.json_command("deploy")
    assert code == 0 and {s["action"] for s in doc["steps"]} == {"kept"}, doc


def test_a_killed_router_is_started_again_alone_bound_to_the_live_generations(
        attested: Installer) -> None:
    """The runbook's row "Router restart with the same fleet document": `status` names the
    router; deploy runs Gate G alone, and the new router admits every engine only with its
    saved profile bound to the live generation Gate E attested."""
    op = attested.op
    old = _owned(attested, "serve", "router")
    _on_router(attested, f"kill -9 {old['pid']}")
    code, doc = op.json_command("status")
    assert code == 0, doc
    assert doc["router"]["down"] and "does not answer" in doc["router"]["reason"], doc["router"]
    assert doc["router"]["repeat"][0].startswith("router: `narwhal serve`")
    assert doc["engines_changed"] == [] and doc["links_moved"] == []
    states = {g["gate"]: g["state"] for g in doc["gates"]}
    assert states == {**{g: "passed" for g in ENGINE_WORK}, "serve": "stale"}, states
    before = _attempts(op)
    code, doc = op.json_command("deploy")
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert {g: s["action"] for g, s in steps.items()} == {
        **{g: "kept" for g in ENGINE_WORK}, "serve": "ran"}
    after = _attempts(op)
    assert {g: len(after[g]) - len(before[g]) for g in after if g != "status"} == {
        **{g: 0 for g in ENGINE_WORK}, "serve": 1}
    served = op.last_attempt("serve")
    assert {r["host"] for r in rows(served)} == {"router"}  # nothing asked of an engine host
    assert steps["serve"]["output"]["router"] == "started"
    bound = steps["serve"]["output"]["engines"]
    for engine in ENGINES:
        attested_doc = json.loads((op.last_attempt("attest") / f"attestation-{engine}.json")
                                  .read_text())
        assert bound[engine]["generation"]["process_start_time_seconds"] == pytest.approx(
            attested_doc["process"]["process_start_time_seconds"], abs=1e-3), engine
    assert _on_router(attested, "pgrep -c -f 'bin/narwhal-serve --fleet'") == "1"


# Polls both router addresses on the router host for 4 s: [[role, epoch] or None, ...] per
# 50 ms sample, to see who serves while the standby takes over.
WATCH_ROUTERS = """python3 - <<'PY'
import json, time, urllib.request
out, end = [], time.monotonic() + 4
while time.monotonic() < end:
    row = []
    for port in (8000, 8001):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/narwhal/state",
                                        timeout=0.5) as reply:
                c = json.load(reply)["controller"]
                row.append([c["role"], c["epoch"]])
        except Exception:
            row.append(None)
    out.append(row)
    time.sleep(0.05)
print(json.dumps(out))
PY"""


def test_a_standby_takes_over_a_killed_primary_and_deploy_starts_a_new_standby(
        attested: Installer) -> None:
    """The fault drill "router killed with a standby": with NARWHAL_ROUTER_STANDBY_URL, Gate
    G starts a warm standby beside the primary; the primary killed, the standby takes over and
    no two routers ever serve at once; `status` names the missing standby; deploy runs Gate G
    alone (the new primary adopted, a standby started at the freed address); a trial through
    the tunnel reaches the new primary; without the variable again, one router is left."""
    op = attested.op
    env = op.variant("standby", NARWHAL_ROUTER_STANDBY_URL="http://127.0.0.1:8001")
    code, doc = op.json_command("deploy", env=env)
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert [g for g, s in steps.items() if s["action"] == "ran"] == ["serve"]
    out = steps["serve"]["output"]
    assert out["router"] == "adopted" and out["router_url"] == "http://127.0.0.1:8000", out
    assert out["standby"]["action"] == "started", out
    epoch = int(out["epoch"])

    _on_router(attested, f"kill -9 {_owned(attested, 'serve', 'router')['pid']}")
    samples = json.loads(_on_router(attested, WATCH_ROUTERS))
    assert not any(all(r and r[0] == "primary" for r in row) for row in samples), samples
    assert samples[-1][0] is None and samples[-1][1][0] == "primary", samples[-1]
    assert samples[-1][1][1] > epoch  # a new fencing epoch, taken through the lease

    code, doc = op.json_command("status", env=env)
    assert code == 0, doc
    assert doc["router"]["down"] and "took over as primary" in doc["router"]["reason"], doc
    assert {g["gate"]: g["state"] for g in doc["gates"]}["serve"] == "stale"
    before = _attempts(op)
    code, doc = op.json_command("deploy", env=env)
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert [g for g, s in steps.items() if s["action"] == "ran"] == ["serve"]
    assert {g: len(v) - len(before[g]) for g, v in _attempts(op).items() if g != "status"} \
        == {**{g: 0 for g in ENGINE_WORK}, "serve": 1}
    out = steps["serve"]["output"]
    assert out["router"] == "adopted" and out["router_url"] == "http://127.0.0.1:8001", out
    assert out["standby"] == {"url": "http://127.0.0.1:8000", "action": "started",
                              "pid": out["standby"]["pid"]}, out
    assert _on_router(attested, "pgrep -c -f 'bin/narwhal-serve --fleet'") == "2"
    code, doc = op.json_command("trial", "--rates", "2", "--requests", "10", env=env)
    assert code == 0, doc
    [r] = doc["rates"]
    assert r["reconciled"]["ok"] and r["ok"] == 10, r

    code, doc = op.json_command("deploy")  # the standby no longer asked for
    assert code == 0 and doc["verdict"] == "passed", doc
    out = {s["gate"]: s for s in doc["steps"]}["serve"]["output"]
    assert out["router"] == "started" and out["router_url"] == "http://127.0.0.1:8000", out
    assert "standby" not in out
    assert _on_router(attested, "pgrep -c -f 'bin/narwhal-serve --fleet'") == "1"


def _engine_running(fleet: Installer, n: int) -> float:
    """Requests engine-n says it is running now, from its own /metrics."""
    record = json.loads((fleet.op.last_attempt("discover") / f"launch-engine-{n}.json")
                        .read_text())
    text = _on_router(fleet, f"curl -s http://{record['fabric_address']}:"
                             f"{record['ports']['engine']}/metrics")
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def _kill_engine_3_while_it_streams(fleet: Installer) -> None:
    """SIGKILL engine-3's container (docker kill) once it reports a request running, while
    the trial's arrivals last."""
    deadline = time.monotonic() + 8  # the trial's arrivals last 10 s; it began 4 s ago
    while _engine_running(fleet, 3) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    ssh(fleet.op.plan, "eng3", "docker kill $(docker ps -q)")


def test_an_engine_killed_mid_trial_is_counted_and_its_ejection_recorded(
        attested: Installer) -> None:
    """Last of the tests that need every engine: the killed engine stays down. Under a steady
    load of streams, engine-3 is killed while it runs a request: every request still completes
    with 200 and a whole stream (a broken stream continued on another engine, a broken
    prefill retried)."""
    code, doc = attested.op.json_command("preflight")  # passed again after the SLO test
    assert code == 0, doc
    code, doc = _trial_while(attested, lambda: _kill_engine_3_while_it_streams(attested),
                             "--rates", "4", "--requests", "40", "--max-tokens", "48")
    [r] = doc["rates"]
    assert code == (0 if r["verdict"] in ("within SLO", "capacity miss") else 1), r
    assert r["reconciled"]["ok"], r  # every sent id once, failed or not
    assert r["statuses"] == {"200": 40}, r
    assert r["ok"] == 40, r  # no stream broke: none ended in an error event or short
    # Whether engine-3 was decoding a stream or prefilling when it died is the placement's
    # choice: a stream it was decoding was continued elsewhere (docs/router.md), a prefill
    # retried; either way the client got its whole answer (the component and real tiers kill
    # a decode engine mid-stream for certain and compare the text)
    continued = r.get("continued")
    if continued is not None:
        assert continued["outcomes"] == {"ok": continued["requests"]}, r
    engine3 = next(e for e in r["router_engines"] if e["id"] == "engine-3")
    assert engine3["ejections"] >= 1 or engine3["held_reason"], engine3
    assert not engine3["admitted"]
    # the fleet lost an engine, and the record shows it: not a client or a scrape at fault
    assert r["verdict"] in ("within SLO", "capacity miss"), r


def test_after_the_crash_deploy_starts_that_engine_again_and_a_full_disk_blocks_it_named(
        attested: Installer, faults: Faults) -> None:
    """After the engine-kill test (engine-3's container is dead): `status` names the work (start
    it again, attest, profile it, full preflight); with node-3's run dir full, deploy stops at
    gate C, blocked, naming the host and the disk, and starts nothing; `recover` leaves the
    record's evidence; with the disk freed, deploy starts engine-3 alone and passes."""
    op = attested.op
    code, doc = op.json_command("status")
    assert code == 0, doc
    [change] = doc["engines_changed"]
    assert change["engine"] == "engine-3" and change["restart"], change
    assert [s.split(":")[0] for s in change["repeat"]] == [
        "start and capture", "attestation", "profile of engine-3", "full preflight", "fabric"]
    states = {g["gate"]: g for g in doc["gates"]}
    assert states["engines"]["state"] == "stale", states["engines"]
    assert "not running, to start again: engine-3" in states["engines"]["reason"]
    assert states["fabric"]["state"] == "passed"

    before = _attempts(op)
    faults.fill("eng3")
    code, doc = op.json_command("deploy")
    assert code == 1 and doc["stopped_at"] == "engines", doc
    said = json.dumps(doc)
    assert "node-3" in said and "disk full" in said and "engine-3" in said, said[-3000:]
    blocked = op.last_attempt("engines")
    assert json.loads((blocked / "attempt.json").read_text())["verdict"] == "blocked"
    assert not any(r["argv"][1:2] == ["start"] or "run" in r["argv"][1:2]
                   for r in rows(blocked) if r.get("argv")), rows(blocked)
    after = _attempts(op)
    assert {g: len(after[g]) - len(before[g]) for g in after if g != "status"} == {
        "discover": 0, "install": 0, "engines": 1, "fabric": 0, "attest": 0, "preflight": 0,
        "serve": 0}
    done = op.narwhal("recover", "engines")
    assert done.returncode == 0 and "evidence is kept" in done.stdout, done.stdout + done.stderr
    assert (blocked / "attempt.json").exists()

    with lifecycle.locked():
        faults.clear()
    code, doc = op.json_command("deploy")
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert {g: s["action"] for g, s in steps.items()} == ENGINE_WORK
    assert steps["engines"]["command"][1:4] == ["engines", "--restart", "engine-3"]
    restarted = op.last_attempt("engines")
    assert {r["host"] for r in rows(restarted)} == {"node-3"}  # no other engine touched
    summary = json.loads((op.last_attempt("attest") / "engine-attestation.json").read_text())
    assert {k: v["sidecar"] for k, v in summary["engines"].items()} == {
        "engine-1": "kept", "engine-2": "kept", "engine-3": "started"}
    [profiled] = _tool_rows(op.last_attempt("preflight"), "narwhal-profile")
    assert [profiled["argv"][i + 1] for i, a in enumerate(profiled["argv"])
            if a == "--only"] == ["engine-3"]


def test_a_link_moved_on_one_host_resamples_only_its_edges_then_runs_full_preflight(
        attested: Installer, faults: Faults) -> None:
    """The runbook's row "Fabric route, host assignment, or transport": node-3's fabric MTU
    changed under a passed fleet; `status` names exactly node-3's four directed edges, and
    deploy measures only those, then exercises the live KV paths (narwhal-check) against the
    saved profiles; no engine is captured, started or profiled again."""
    op = attested.op
    faults.mtu("eng3", 1500)
    code, doc = op.json_command("status")
    assert code == 0, doc
    moved = {c["edge"]: c["moved"] for c in doc["links_moved"]}
    assert set(moved) == {e for e in PAIRS_BY_HOST if "node-3" in e}, moved
    assert moved["node-1->node-3"] == ["destination_interface"]
    assert moved["node-3->node-1"] == ["source_interface"]
    states = {g["gate"]: g for g in doc["gates"]}
    assert states["engines"]["state"] == "passed"
    assert states["fabric"]["state"] == "stale" and "node-3->node-2" in \
        states["fabric"]["reason"], states["fabric"]
    assert states["preflight"]["state"] == "stale"
    before = _attempts(op)
    code, doc = op.json_command("deploy")
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert {g: steps[g]["action"] for g in ("discover", "install", "engines")} == {
        "discover": "kept", "install": "kept", "engines": "kept"}
    assert steps["fabric"]["action"] == steps["preflight"]["action"] == "ran"
    after = _attempts(op)
    assert after["engines"] == before["engines"]
    edges = json.loads((op.last_attempt("fabric") / "edges.json").read_text())["edges"]
    resampled = {e["edge"] for e in edges if not e["reused"]}
    assert resampled == set(moved), edges
    summary = json.loads((op.last_attempt("attest") / "engine-attestation.json").read_text())
    assert {v["sidecar"] for v in summary["engines"].values()} == {"kept"}
    preflight = op.last_attempt("preflight")
    assert _tool_rows(preflight, "narwhal-profile") == []  # the same engine processes
    assert _tool_rows(preflight, "narwhal-check")
    code, doc = op.json_command("status")
    assert doc["links_moved"] == [] and {g["state"] for g in doc["gates"]} == {"passed"}, doc


def test_an_engine_whose_kv_events_never_reach_the_router_fails_preflight_naming_the_flag(
        attested: Installer, faults: Faults) -> None:
    """narwhal-check's events gate on the lab: engine-3 publishes nothing the router host can
    hear (its events port closed on its host, what an engine started without
    --kv-events-config looks like from there), so `narwhal preflight` fails naming engine-3,
    the flag and the .env field; with the port open again, deploy passes."""
    op = attested.op
    record = json.loads((op.last_attempt("discover") / "launch-engine-3.json").read_text())
    faults.block("eng3", int(record["ports"]["kv_events"]))
    try:
        code, doc = op.json_command("preflight")
    finally:
        faults.clear()
    assert code != 0 and doc["verdict"] != "passed", doc
    said = json.dumps(doc)
    assert "events engine-3" in said and "--kv-events-config" in said, said[-3000:]
    assert "NARWHAL_KV_EVENTS_PORT" in said and "events engine-1" not in said
    code, doc = op.json_command("deploy")
    assert code == 0 and doc["verdict"] == "passed", doc
    code, doc = op.json_command("status")
    assert {g["state"] for g in doc["gates"]} == {"passed"}, doc


def test_a_shaped_link_blocks_deploy_at_the_fabric_until_cleared_then_only_it_is_measured(
        attested: Installer, faults: Faults) -> None:
    """The shaped-link drill: a policer on node-1->node-2 moves nothing in the link record, so
    the operator measures that edge on purpose (`narwhal fabric --resample`), which blocks
    Gate D naming it; deploy then stops at the fabric, blocked, the edge named, and runs no
    gate after it; with the shaping cleared, deploy measures that edge alone (the other five
    reused by fingerprint) and passes, no engine captured, started or attested again."""
    op = attested.op
    faults.shape("eng1", "eng2", "10mbit")
    code, doc = op.json_command("fabric", *GATE_ARGS["fabric"], "--resample", "node-1->node-2")
    assert code != 0 and doc["verdict"] == "blocked", doc
    assert [p["field"] for p in doc["problems"]] == ["node-1->node-2"], doc["problems"]
    code, doc = op.json_command("status")
    states = {g["gate"]: g for g in doc["gates"]}
    assert states["fabric"]["state"] == "blocked", states["fabric"]
    assert states["engines"]["state"] == "passed"  # the gates after D wait on it

    before = _attempts(op)
    code, doc = op.json_command("deploy")
    assert code == 1 and doc["stopped_at"] == "fabric", doc
    assert "node-1->node-2" in json.dumps(doc)
    after = _attempts(op)
    gates = ("discover", "install", "engines", "fabric", "attest", "preflight", "serve")
    assert {g: len(after.get(g, [])) - len(before.get(g, [])) for g in gates} == {
        "discover": 0, "install": 0, "engines": 0, "fabric": 1, "attest": 0, "preflight": 0,
        "serve": 0}
    still = op.last_attempt("fabric")
    assert {e["edge"] for e in json.loads((still / "edges.json").read_text())["edges"]
            if not e["reused"]} == {"node-1->node-2"}  # only the failed edge, again

    faults.clear()
    code, doc = op.json_command("deploy")
    assert code == 0 and doc["verdict"] == "passed", doc
    steps = {s["gate"]: s for s in doc["steps"]}
    assert {g: steps[g]["action"] for g in ("discover", "install", "engines", "fabric")} == {
        "discover": "kept", "install": "kept", "engines": "kept", "fabric": "ran"}
    edges = json.loads((op.last_attempt("fabric") / "edges.json").read_text())["edges"]
    assert {e["edge"] for e in edges if not e["reused"]} == {"node-1->node-2"}, edges
    assert {e["edge"]: e["verdict"] for e in edges} == dict.fromkeys(PAIRS_BY_HOST, "pass")
    assert _attempts(op)["engines"] == before["engines"]
    summary = json.loads((op.last_attempt("attest") / "engine-attestation.json").read_text())
    assert {v["sidecar"] for v in summary["engines"].values()} == {"kept"}
    code, doc = op.json_command("status")
    assert {g["state"] for g in doc["gates"]} == {"passed"}, doc


def test_a_re_keyed_host_stops_deploy_before_any_gate_until_its_key_is_replaced(
        attested: Installer, faults: Faults) -> None:
    """The lab's re-key restarts the whole host, so what it ran (engine-3 and its sidecar) is
    gone too, as after a reinstall."""
    op = attested.op
    before = _attempts(op)
    faults.rekey("eng3")
    code, doc = op.json_command("deploy")
    assert code == 1 and doc["stopped_at"] == "access", doc
    said = json.dumps(doc["hosts"])
    assert "node-3" in said and said.count("SHA256:") >= 2, said  # pinned and offered
    assert "narwhal hosts trust --replace" in doc["fix"]
    assert _attempts(op) == before  # no gate ran on a host that is not the one pinned
    assert op.narwhal("hosts", "trust", "--yes", "--replace", "node-3").returncode == 0
    code, doc = op.json_command("deploy")
    assert doc.get("stopped_at") != "access", doc  # the host is the one pinned now
    steps = {s["gate"]: s for s in doc["steps"]}
    assert steps["discover"]["action"] == steps["install"]["action"] == "kept", doc["steps"]
    # the restart lost node-3's run dir, so engine-3 is started again, not captured in place;
    # the container it left under its name is one the record owns, so it is replaced
    assert steps["engines"]["command"][1:4] == ["engines", "--restart", "engine-3"], steps
    assert code == 0 and doc["verdict"] == "passed", doc
    restarted = op.last_attempt("engines")
    owned = json.loads((restarted / "plan.json").read_text())["owned_containers"]["node-3"]
    removed = [r["argv"][3] for r in rows(restarted)
               if r["host"] == "node-3" and r["argv"][:3] == ["docker", "rm", "-f"]]
    assert len(removed) == 1 and any(o.startswith(removed[0] + ":") for o in owned), removed
    # a new host key may be a new machine: its links are measured again (the others kept)
    edges = json.loads((op.last_attempt("fabric") / "edges.json").read_text())["edges"]
    assert {e["edge"] for e in edges if not e["reused"]} == {
        e for e in PAIRS_BY_HOST if "node-3" in e}
    with lifecycle.locked():
        faults.clear()  # the original key back, and pinned again
    assert op.narwhal("hosts", "trust", "--yes", "--replace", "node-3").returncode == 0


def test_the_exported_record_of_the_whole_deployment_names_nothing_private(
        attested: Installer, tmp_path: Path) -> None:
    """Every byte of the export of a deployment taken through A to G, with trials and their
    reports: no lab address, host name, user name, home path, private path (model dir, run
    dir, SSH key, runs folder) or secret; and it still reads. The lab is IPv4 only
    (lab/network.py assigns no IPv6), so there are no compressed IPv6 spellings to look for."""
    op = attested.op
    out = tmp_path / "exported" / "lab"
    done = subprocess.run([NARWHAL, "record", "export", "--out", str(out), "--env", str(op.env),
                           "--runs", str(op.runs)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in op.env.read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    secrets_ = {k: v for k, v in env.items()
                if any(s in k for s in ("PASSWORD", "TOKEN", "API_KEY", "ENGINE_KEY")) and v}
    lease_key = op.runs / "lab" / ".controller-lease.key"
    if lease_key.exists():
        secrets_["controller lease key"] = lease_key.read_text().strip()
    plain = {**{v: k for k, v in secrets_.items()}, "/root": "home path",
             **{ip: f"address of {h.name}" for h in op.plan.hosts
                for ip in (h.mgmt_ip, h.fabric_ip)}, op.plan.ws_ip: "workstation address"}
    # the lab's `.env` shell-quotes its values; a path is looked for as the product reads it
    paths = {shlex.split(env[k])[0]: k for k in ("NARWHAL_MODEL_DIR", "NARWHAL_RUN_DIR",
                                                 "NARWHAL_SSH_KEY") if env.get(k)}
    paths |= {str(op.runs.resolve()): "runs folder", str(op.runs.absolute()): "runs folder"}
    plain.update({p.rstrip("/"): what for p, what in paths.items()})
    words = {name: "host name" for name in {h.netns for h in op.plan.hosts}
             | {socket.gethostname()}}
    words.update({v.split("@")[0]: "user name" for k, v in env.items()
                  if k.endswith("_SSH") and "@" in v})
    found: list[str] = []
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "report.html" for p in files) and len(files) > 200
    for path in files:
        data = path.read_bytes()
        found += [f"{path.relative_to(out)}: {what}" for needle, what in plain.items()
                  if needle.encode() in data]
        found += [f"{path.relative_to(out)}: {what} {name}" for name, what in words.items()
                  if re.search(rb"(?<![A-Za-z0-9_-])" + re.escape(name.encode())
                               + rb"(?![A-Za-z0-9_])", data)]
    assert not found, found[:20]
    status = subprocess.run([NARWHAL, "status", "--json", "--offline", "--env", str(op.env),
                             "--runs", str(out.parent)], capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr
    assert {g["gate"] for g in json.loads(status.stdout)["gates"]} >= {"discover", "serve"}
