"""Gate F: profile once and run the live KV contract, on the router host (`narwhal preflight`).

Plan (recorded first): the router host, the folder of this prepared run the router will serve
from, and every engine. Execute, over the router host's session only (the peer that will rely
on what is measured):
1. the fleet document there: Gate E's finalised fleet with the SLO the `.env` says now and
   `profiles.path`, and Gate C's captures with Gate A's launch records beside it (the
   calibrated fleet also names the live KV canary's reference and the `.env`'s period);
2. which engines need profiling: all when there is no store yet, else those whose row the
   profile gate of `narwhal-check --only profile` does not bind to the live generation (the
   engine version, process start and attestation digest): a restarted engine is profiled
   again, the others keep their rows;
3. `narwhal-profile --only ...` for those (nothing when every row binds);
4. `narwhal-check` with every gate: reach, model, profile, pace, tokenize, the kv gate over
   every ordered pair, the contract gate against Gate C's captures, and the SLO.
Each tool's result line is parsed; the store, its samples and the check evidence are copied
into the attempt. The fleet is checked as `fleet-candidate.json` and becomes the `fleet.json`
the router reads only when everything passed. A failed verdict blocks the gate, naming the engine or pair and its budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from narwhal.core import result_line
from narwhal.core.documents import canonical_json
from narwhal.core.errors import ContractError, GateBlocked, HostError, LedgerError, Problem
from narwhal.core.fleet import HANDOFF_BUDGET_MAX_S, KV_CANARY_INTERVAL_S, checked_fleet
from narwhal.deploy.gates import tokenizer as tok
from narwhal.deploy.gates.engines import INSTALL_PLAN
from narwhal.deploy.gates.handoff import passed_artifact
from narwhal.deploy.gates.install import install_dir, installed_tool
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt

FLEET = Reads("attest", "fleet.json")
CONTRACT = Reads("engines", "contract.json")
# The runbook's row "Fabric route, host assignment, or transport": links measured again are
# followed by the live KV paths exercised, so Gate D's link records are an input here too
# (not its edge verdicts: a sample judged again against a moved workload's budget moves no
# link, and the runbook keeps the full preflight for a workload inside the profiled range).
LINKS = Reads("fabric", "links.json")
READS = (INSTALL_PLAN, CONTRACT, FLEET, LINKS)  # its spec: gates/registry.py
PROFILE, CHECK = "narwhal-profile", "narwhal-check"
TOOL_TIMEOUT_S = 900.0
STORE, SAMPLES = "profiles.json", "profiles.json.samples.jsonl"
CALIBRATION = "first-token-calibration.json"
CANARY = "kv-canary.json"  # the live KV canary's reference, recorded with the calibration
Progress = Callable[[str, str], None]


@dataclass
class PreflightPlan:
    router: str
    install: dict[str, Any]
    fleet: dict[str, Any]  # as the router host gets it
    files: dict[str, bytes]  # captures/<name> -> bytes (Gate A's launch records, C's captures)
    cover: int = 1  # the workload's prompt tokens: every profile row must have measured them
    # tokenizer/<name> -> bytes: Gate A's copy of the checkpoint's tokenizer, when engines
    # publish KV events (the router keys prompts with it; deploy/gates/tokenizer.py)
    tokenizer: dict[str, bytes] = field(default_factory=dict)
    # the live KV canary's period (NARWHAL_KV_CANARY_INTERVAL_S), written with its reference
    canary_interval_s: float = KV_CANARY_INTERVAL_S

    def document(self) -> dict[str, Any]:
        return {"router_host": self.router, "engines": [e["id"] for e in self.fleet["engines"]],
                "slo": self.fleet["slo"], "profiles": self.fleet["profiles"],
                "profile_cover_tokens": self.cover, "captures": sorted(self.files),
                "kv_canary_interval_s": self.canary_interval_s,
                **({"tokenizer": sorted(self.tokenizer)} if self.tokenizer else {})}


def plan(inputs: Inputs, ledger: Ledger, router_host: str) -> PreflightPlan:
    install = passed_artifact(ledger, "preflight", INSTALL_PLAN).json()
    passed_artifact(ledger, "preflight", CONTRACT)
    fleet = dict(passed_artifact(ledger, "preflight", FLEET).json())
    fleet["slo"] = {**fleet.get("slo", {}), "ttft_s": inputs.ttft_s, "tpot_s": inputs.tpot_s}
    fleet["serving"] = {**fleet.get("serving", {}),
                        "handoff_budget_s": handoff_budget_s(inputs.workload.transfer_budget_ms)}
    fleet["profiles"] = {"path": STORE}
    files = {}
    for e in fleet["engines"]:
        for gate, name in (("discover", f"launch-{e['id']}.json"),
                           ("engines", f"cache-layout-{e['id']}.json")):
            files[name] = passed_artifact(ledger, "preflight", Reads(gate, name)).read_bytes()
    tokenizer = router_tokenizer(ledger) if any(e.get("kv_events") for e in fleet["engines"]) \
        else {}
    if tokenizer:
        fleet["prefix_cache"] = {**fleet.get("prefix_cache", {}),
                                 "tokenizer_dir": tok.ROUTER_DIR}
    checked_fleet(fleet, "fleet-candidate.json (Gate F, Gate E's fleet with the .env's SLO)")
    return PreflightPlan(router_host, install, fleet, files, inputs.workload.prompt_tokens,
                         tokenizer, inputs.kv_canary_interval_s)


def handoff_budget_s(transfer_budget_ms: float) -> float:
    """The fleet's `serving.handoff_budget_s`: the transfer budget Gate D proves every edge
    meets, from which the router derives a handoff's first-byte deadline (docs/router.md
    "Deadlines"). The router caps every deadline at its fixed timeouts, so a budget past the
    fleet's hour bound means the same as the bound."""
    return min(transfer_budget_ms / 1000.0, HANDOFF_BUDGET_MAX_S)


def kv_canary(interval_s: float) -> dict[str, Any]:
    """The fleet's kv_canary section once the calibration wrote the reference beside it. Only
    the calibrated fleet has one: the fleet narwhal-check is given before holds no reference."""
    return {"path": CANARY, "interval_s": interval_s}


def router_tokenizer(ledger: Ledger) -> dict[str, bytes]:
    """The tokenizer files Gate A kept (its manifest names them), for the router host."""
    manifest = passed_artifact(ledger, "preflight", Reads("discover", tok.MANIFEST)).json()
    return {name: passed_artifact(ledger, "preflight", Reads("discover", name)).read_bytes()
            for name in manifest["files"]}


def _result(host: Host, done_text: str, stderr: bytes, command: str) -> result_line.ResultLine:
    try:
        return result_line.parse(done_text, command)
    except ContractError:
        raise HostError(host.alias, f"`{command}` printed no result line: "
                        f"{stderr.decode('utf-8', 'replace').strip()[-300:]}") from None


def _read(host: Host, path: str) -> bytes:
    return host.run(cl.read_file(path), check=True).stdout


def _failed(evidence: dict[str, Any]) -> list[Problem]:
    """Every failed verdict of narwhal-check's evidence, named by gate and engine or pair."""
    return [Problem(f"{v['gate']} {v['subject']}",
                    f"measured {v.get('measured') or '-'}, budget {v.get('budget') or '-'}",
                    str(v.get("detail") or "follow the engine, leg or budget it names"))
            for v in evidence.get("verdicts", []) if v.get("status") == "fail"]


class RouterFolder:
    """The router host's folder of this prepared run: the fleet, its captures, the store."""

    def __init__(self, host: Host, install: dict[str, Any], attempt: Attempt) -> None:
        base = install_dir(host, str(install["remote_dir"]))
        self.host, self.attempt = host, attempt
        self.path = f"{base}/runs/{install['prepared_run']}/router"
        # Checked as a candidate; only a passed preflight makes it the fleet the router reads,
        # so an edit that fails (an SLO below the profiled floor) never reaches a router.
        self.fleet = f"{self.path}/fleet-candidate.json"
        self.serving = f"{self.path}/fleet.json"
        self.captures = f"{self.path}/captures"
        self.profile = installed_tool(host, str(install["remote_dir"]), PROFILE)
        self.check = installed_tool(host, str(install["remote_dir"]), CHECK)

    def place(self, p: PreflightPlan) -> None:
        self.host.run(cl.private_dir(self.captures), check=True)
        self.host.put(canonical_json(p.fleet).encode() + b"\n", self.fleet, exclusive=False)
        for name, data in p.files.items():
            self.host.put(data, f"{self.captures}/{name}", exclusive=False)
        if p.tokenizer:  # the folder the fleet names in prefix_cache.tokenizer_dir
            folder = f"{self.path}/{tok.ROUTER_DIR}"
            self.host.run(cl.private_dir(folder), check=True)
            for name, data in p.tokenizer.items():
                self.host.put(data, f"{folder}/{name}", exclusive=False)

    def has_store(self) -> bool:
        return self.host.stat_file(f"{self.path}/{STORE}") is not None

    def check_run(self, tag: str, *extra: str) -> tuple[result_line.ResultLine, dict[str, Any]]:
        """narwhal-check with `extra`; its result line and its evidence (kept in the attempt)."""
        evidence = f"{self.path}/preflight-{self.attempt.id}-{tag}.json"
        done = self.host.run([self.check, "--fleet", self.fleet, "--evidence", evidence,
                              *extra], timeout=TOOL_TIMEOUT_S)
        got = _result(self.host, done.text, done.stderr, CHECK)
        if self.host.stat_file(evidence) is None:
            raise HostError(self.host.alias, f"`{CHECK}` wrote no evidence: {got.error}")
        data = _read(self.host, evidence)
        self.attempt.add_artifact(f"check-{tag}.json", data)
        return got, json.loads(data)


def uncovered(store: dict[str, Any], cover: int) -> dict[str, int]:
    """Engine -> the longest prompt its row measured, for rows short of `cover` tokens: their
    curves would extrapolate to the workload's prompts (the runbook's "profiled workload
    range"), so the row is measured again with the sweep reaching them."""
    out = {}
    for row in store.get("profiles", []):
        longest = int(row.get("prefill", {}).get("max_prompt_tokens", 0))
        if longest < cover:
            out[str(row.get("engine_id"))] = longest
    return out


def range_gap(ledger: Ledger, cover: int) -> str:
    """Why Gate F's passed record no longer holds for a workload of `cover`-token prompts, read
    from its saved profiles: the rows whose measured range falls short, each with its range
    (they are profiled again, the rest kept). Empty when every row covers it, or when there is
    no passed store to judge."""
    try:
        store = passed_artifact(ledger, "status", Reads("preflight", STORE)).json()
    except (GateBlocked, LedgerError, OSError, ValueError):
        return ""
    short = uncovered(store, cover)
    if not short:
        return ""
    return (f"the workload's {cover}-token prompts are beyond the profiled range: profile "
            "again over it " + ", ".join(f"{e} (measured up to {n} of {cover} tokens)"
                                         for e, n in short.items()))


def to_profile(folder: RouterFolder, engines: list[str], progress: Progress, cover: int,
               tag: str = "generations") -> list[str]:
    """The engines whose row does not pass the profile gate (not bound to their live
    generation, curves that fit poorly) or did not measure the workload's prompt length
    (all, without a store)."""
    if not folder.has_store():
        return engines
    progress("profiles", "matching each row to its live engine generation")
    _, evidence = folder.check_run(tag, "--only", "profile")
    bound = {v["subject"] for v in evidence.get("verdicts", [])
             if v.get("gate") == "profile" and v.get("status") == "pass"}
    short = uncovered(json.loads(_read(folder.host, f"{folder.path}/{STORE}")), cover)
    for engine, longest in short.items():
        if engine in bound and engine in engines:
            progress("profiles", f"{engine}: measured prompts up to {longest} tokens, the "
                     f"workload's are {cover}: profiling it again over that range")
    return [e for e in engines if e not in bound or e in short]


def _profile(folder: RouterFolder, engines: list[str], cover: int) -> None:
    """narwhal-profile for `engines` (the store's other rows kept); blocked when it fails."""
    args = [a for e in engines for a in ("--only", e)]
    done = folder.host.run([folder.profile, "--fleet", folder.fleet, *args, "--overwrite",
                            "--cover", str(cover)], timeout=TOOL_TIMEOUT_S)
    got = _result(folder.host, done.text, done.stderr, PROFILE)
    if not got.ok:
        problems = [Problem(f"profile {e['engine_id']}", str(e["error"]),
                            "let the engine go idle, or correct it, and run again")
                    for e in got.data.get("engines", []) if not e.get("ok")]
        raise GateBlocked("preflight", f"narwhal-profile: {got.error}", problems or [
            Problem("profile", got.error, "read the attempt's commands.jsonl")])


def profile(folder: RouterFolder, engines: list[str], progress: Progress, cover: int
            ) -> tuple[list[str], list[str]]:
    """Profile what does not bind; (profiled, profiled again). A row measured while the
    machine was busy can fit poorly; the fix the profile gate names is to profile it again on
    an idle engine, so each such engine is profiled once more, alone, before the full check
    judges it (a second poor fit blocks the gate there, named)."""
    profiled = to_profile(folder, engines, progress, cover)
    if not profiled:
        progress("profiles", "every row is bound to its live engine: nothing to profile")
        return [], []
    progress("profiles", f"profiling {', '.join(profiled)} (the others keep their rows)")
    _profile(folder, profiled, cover)
    again = to_profile(folder, profiled, progress, cover, tag="fit")
    for engine in again:
        progress("profiles", f"{engine}: its curves fit poorly; profiling it again, alone")
        _profile(folder, [engine], cover)
    return profiled, again


def calibrate(folder: RouterFolder, p: PreflightPlan, progress: Progress) -> float:
    """First-token calibration over every ordered pair; the fleet then names it, so the router
    refuses a deadline below it. Blocked when the fleet's own deadline is below it already."""
    progress("calibration", "sampling first-token times of every pair")
    out = f"{folder.path}/{CALIBRATION}"
    canary = f"{folder.path}/{CANARY}"
    folder.host.run(["rm", "-f", "--", canary], check=True)  # never an earlier run's reference
    got, _ = folder.check_run("calibration", "--calibrate-first-token", "--calibration-out", out,
                              "--canary-out", canary)
    if not got.ok:
        raise GateBlocked("preflight", f"first-token calibration failed: {got.error}", [
            Problem("calibration", got.error, "read check-calibration.json in the attempt")])
    data = _read(folder.host, out)
    folder.attempt.add_artifact(CALIBRATION, data)
    candidate = float(json.loads(data)["candidate_s"])
    deadline = float(p.fleet.get("serving", {}).get("first_token_timeout_s", 60.0))
    if deadline < candidate:
        raise GateBlocked("preflight", f"the first-token deadline {deadline:g} s is below the "
                          f"calibrated {candidate:g} s", [Problem(
                              "serving.first_token_timeout_s", f"{deadline:g} s is below the "
                              f"calibrated candidate {candidate:g} s", "raise it in the fleet "
                              "or find why first tokens are slow (the pair evidence names them)")])
    named: dict[str, Any] = {"calibration": {"path": CALIBRATION}}
    if folder.host.stat_file(canary) is not None:  # a fleet with at least one pair
        folder.attempt.add_artifact(CANARY, _read(folder.host, canary))
        named["kv_canary"] = {**p.fleet.get("kv_canary", {}), **kv_canary(p.canary_interval_s)}
    final = canonical_json(checked_fleet({**p.fleet, **named}, "fleet.json (Gate F, calibrated)")
                           ).encode() + b"\n"
    folder.host.put(final, folder.fleet, exclusive=False)
    folder.attempt.add_artifact("fleet-calibrated.json", final)
    folder.host.run(["mv", "-f", "--", folder.fleet, folder.serving], check=True)
    return candidate


def execute(host: Host, attempt: Attempt, p: PreflightPlan,
            progress: Progress) -> dict[str, Any]:
    folder = RouterFolder(host, p.install, attempt)
    progress(p.router, f"placing the fleet document and captures in {folder.path}")
    folder.place(p)
    attempt.add_json("fleet.json", p.fleet)
    engines = [e["id"] for e in p.fleet["engines"]]
    profiled, again = profile(folder, engines, progress, p.cover)
    for name in (STORE, SAMPLES):
        attempt.add_artifact(name, _read(host, f"{folder.path}/{name}"))
    progress("check", "narwhal-check: every gate, every ordered pair, the contract, the SLO")
    got, evidence = folder.check_run("full", "--captures", folder.captures)
    problems = _failed(evidence)
    if not got.ok or problems:
        raise GateBlocked("preflight", "; ".join(x.line() for x in problems[:2])
                          or got.error, problems)
    candidate = calibrate(folder, p, progress)
    verdicts = evidence.get("verdicts", [])
    return {"router_host": p.router, "profiled": profiled, "profiled_again": again,
            "first_token_candidate_s": candidate,
            "kept": [e for e in engines if e not in profiled],
            "summary": evidence.get("summary"),
            "passed": {gate: sorted(v["subject"] for v in verdicts
                                    if v["gate"] == gate and v["status"] == "pass")
                       for gate in ("kv", "contract", "slo", "profile")}}
