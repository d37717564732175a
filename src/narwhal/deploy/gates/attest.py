"""Gate E: attest the live engine processes (`narwhal attest`).

Plan (recorded first): per engine its host, run dir and sidecar address (its fabric address
and the launch record's attest port). Execute, every engine at once: `narwhal-attest serve`
started detached on the engine host and owned by the attempt; then, from the router host (the
peer that will rely on it), `narwhal-attest fetch` of its /v1/attestation until it answers.
Each document is held to Gate C's capture of that engine (engine, deployment, launch record,
compatibility hash, process start time) and to its own digest. The evidence: every
attestation, engine-attestation.json, and the fleet document before (Gate A's draft) and
after (one contract and an attestation_url per engine).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from narwhal.core import result_line
from narwhal.core.cache_layout import CacheLayout, parse_cache_layout
from narwhal.core.documents import digest
from narwhal.core.engine_attestation import (
    AttestedEngine,
    EngineAttestation,
    attestation_findings,
    fleet_attestation,
    parse_attestation,
    parse_fleet_attestation,
)
from narwhal.core.errors import (
    ContractError,
    GateBlocked,
    HostError,
    InputError,
    LedgerError,
    Problem,
)
from narwhal.core.fleet import QUORUM_MEMBERS_MAX, checked_fleet
from narwhal.core.private_file import write_private
from narwhal.deploy.gates.engines import INSTALL_PLAN, EngineTarget, targets_for
from narwhal.deploy.gates.handoff import passed_artifact, passed_attempt
from narwhal.deploy.gates.install import install_dir, installed_tool
from narwhal.deploy.gates.owned_processes import earlier_processes, retire
from narwhal.deploy.gates.parallel import each
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt

CONTRACT = Reads("engines", "contract.json")
# Attestation follows fabric qualification. It reads Gate D's link records, not its edge
# verdicts: a workload that moved re-judges the samples against a new budget, which changes no
# link and so no engine this gate vouches for.
LINKS = Reads("fabric", "links.json")
DRAFT = Reads("discover", "fleet-draft.json")
READS = (INSTALL_PLAN, CONTRACT, LINKS, DRAFT)  # its spec: gates/registry.py
COMMAND = "narwhal-attest"
SCHEMA = "narwhal.engine-attestation"
READY_S = 20.0
KEY_FILE = ".controller-lease.key"
MIN_QUORUM = 3  # sidecars; below it a majority is too few to outlive one host
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class Sidecar:
    target: EngineTarget
    capture: CacheLayout
    bind: str
    port: int
    # NARWHAL_NODE_<n>_ATTESTATION_URL: where the router host reaches this sidecar when that is
    # not the address it binds (a name, a NAT); the fleet and the lease URLs then use it
    reached_at: str | None = None

    @property
    def url(self) -> str:
        return self.reached_at or f"http://{self.bind}:{self.port}/v1/attestation"

    @property
    def lease_url(self) -> str:
        return self.url.removesuffix("/v1/attestation") + "/v1/lease"

    @property
    def run_dir(self) -> str:
        return f"{self.target.record.run_dir}/{self.target.role}"


@dataclass
class AttestPlan:
    sidecars: list[Sidecar]
    install: dict[str, Any]
    router: str  # the physical host the router runs on
    draft: dict[str, Any]
    previous: dict[str, EngineAttestation]  # the last passed attempt's attestation per engine

    def document(self) -> dict[str, Any]:
        return {"router_host": self.router,
                "sidecars": [{"engine": s.target.role, "host": s.target.alias,
                              "run_dir": s.run_dir, "url": s.url} for s in self.sidecars],
                "kept_if_still_vouching": {role: d.digest
                                           for role, d in sorted(self.previous.items())}}


def sidecars_reached_at(inputs: Inputs) -> dict[str, str]:
    """engine -> NARWHAL_NODE_<n>_ATTESTATION_URL, for the engines that set one."""
    return {e.role: e.attestation_url for e in inputs.engines if e.attestation_url}


def plan(inputs: Inputs, ledger: Ledger, router_host: str) -> AttestPlan:
    install = passed_artifact(ledger, "attest", INSTALL_PLAN).json()
    passed_artifact(ledger, "attest", LINKS)  # blocked until Gate D passed
    draft = passed_artifact(ledger, "attest", DRAFT).json()
    reached_at = sidecars_reached_at(inputs)
    sidecars = []
    for t in targets_for(inputs, ledger, "attest"):
        art = passed_artifact(ledger, "attest", Reads("engines", f"cache-layout-{t.role}.json"))
        capture = parse_cache_layout(art.json(), f"engines: cache-layout-{t.role}.json")
        sidecars.append(Sidecar(t, capture, t.record.fabric_address, t.record.ports.attest,
                                reached_at.get(t.role)))
    return AttestPlan(sidecars, install, router_host, draft, previous_attestations(ledger))


def previous_attestations(ledger: Ledger) -> dict[str, EngineAttestation]:
    """The attestations of the last passed attempt (read before this attempt starts, since a
    running attempt makes the gate's state `running`), by engine."""
    if passed_attempt(ledger, "attest") is None:
        return {}
    try:
        summary = passed_artifact(ledger, "attest", Reads("attest", "engine-attestation.json"))
        roles = parse_fleet_attestation(summary.json(), str(summary.path)).engines
        out = {}
        for role in roles:
            art = passed_artifact(ledger, "attest", Reads("attest", f"attestation-{role}.json"))
            out[role] = parse_attestation(art.json(), str(art.path))
        return out
    except (GateBlocked, LedgerError, InputError):
        return {}  # none to keep: every sidecar is started afresh


def findings(s: Sidecar, doc: dict[str, Any], deployment: str) -> list[str]:
    """Why this attestation does not vouch for the engine Gate C captured (empty: it does)."""
    c = s.capture
    want = {"schema": SCHEMA, "schema_version": 1, "deployment": deployment,
            "engine": s.target.role, "launch_record_sha256": s.target.launch_sha256,
            "compatibility_hash": c.ranks[0].compatibility_hash, "vllm_version": c.version}
    out = [f"{k} is {doc.get(k)!r}, expected {v!r}" for k, v in want.items() if doc.get(k) != v]
    process = doc.get("process")
    process = process if isinstance(process, dict) else {}
    if process.get("process_start_time_seconds") != c.process_start_time_seconds:
        out.append(f"process start {process.get('process_start_time_seconds')!r} is not the "
                   f"captured {c.process_start_time_seconds!r}")
    if process.get("id") != c.started.id:
        out.append("the attested container or process is not the one Gate C started")
    body = {k: v for k, v in doc.items() if k != "digest"}
    if doc.get("digest") != digest(body):
        out.append("the document's digest does not match its content (tampered)")
    # What it vouches for checked, the rest of it is held to the schema, so every attestation
    # a passed attempt keeps is one its readers can parse (each problem named by its field).
    return out or attestation_findings(doc)


def _fetch(router: Host, tool: str, url: str) -> dict[str, Any]:
    """GET the attestation from the router host until it answers 200 or READY_S passes."""
    deadline = time.monotonic() + READY_S
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        done = router.run([tool, "fetch", "--url", url, "--timeout", "5"], timeout=30)
        try:
            got = result_line.parse(done.text, f"{COMMAND} fetch")
        except ContractError:
            raise HostError(router.alias, f"`{COMMAND} fetch` printed no result line: "
                            f"{done.stderr.decode('utf-8', 'replace')[-300:]}") from None
        if got.ok and int(got.data.get("status", 0)) == 200:
            return dict(got.data["document"])
        last = {"error": got.error} if not got.ok else dict(got.data)
        time.sleep(0.2)
    raise HostError(router.alias, f"{url} did not attest within {READY_S:.0f} s: "
                    f"{str(last)[:300]}")


def previous_sidecars(ledger: Ledger, this_attempt: str) -> list[dict[str, Any]]:
    """The sidecar processes earlier attest attempts started (their owned.jsonl rows)."""
    return earlier_processes(ledger, "attest", this_attempt, COMMAND)


def kept_attestation(previous: EngineAttestation | None, router: Host, router_tool: str,
                     s: Sidecar, deployment: str) -> dict[str, Any] | None:
    """The last passed attempt's attestation of this engine when it still holds: made for the
    capture Gate C holds now, and its sidecar answering that very document to the router host.
    Such a sidecar is kept running (and its document carried); only the others are replaced."""
    if previous is None:
        return None
    doc = previous.model_dump(by_alias=True)
    if findings(s, doc, deployment):
        return None  # not of the capture Gate C holds now (captured again since)
    done = router.run([router_tool, "fetch", "--url", s.url, "--timeout", "5"], timeout=30)
    try:
        got = result_line.parse(done.text, f"{COMMAND} fetch")
    except ContractError:
        return None
    if not got.ok or int(got.data.get("status", 0)) != 200 \
            or got.data.get("document", {}).get("digest") != previous.digest:
        return None
    return doc


def controller_key(ledger: Ledger) -> bytes:
    """The deployment's controller key, made once: the sidecars grant the controller lease
    only to a router that shows it. It lives beside the record in a dot file (so `narwhal
    record export` leaves it out), mode 0600, and travels to hosts only as file content."""
    path = ledger.root / KEY_FILE
    if not path.exists():
        write_private(path, secrets.token_hex(24) + "\n")
    return path.read_bytes()


def provision_key(host: Host, install: dict[str, Any], key: bytes) -> str:
    """Put the controller key on `host` (a private folder of the prepared run); its path."""
    folder = (f"{install_dir(host, str(install['remote_dir']))}/runs/"
              f"{install['prepared_run']}/controller")
    path = f"{folder}/lease.key"
    # exclusive: the same key again passes, another one is refused
    host.put_file(key, path, private_folder=True)
    return path


def _settled(outcomes: Any, attempt: Attempt, deployment: str
             ) -> tuple[dict[str, dict[str, Any]], list[Problem]]:
    """Each sidecar's attestation kept as evidence, and every problem: a host that failed, or
    an attestation that does not vouch for what Gate C captured."""
    docs: dict[str, dict[str, Any]] = {}
    problems: list[Problem] = []
    for o in outcomes:
        s = o.item
        if o.error is not None:
            if not isinstance(o.error, HostError):
                raise o.error
            problems.append(Problem(f"{s.target.alias}: {s.target.role}",
                                    str(o.error).splitlines()[0],
                                    f"read {s.run_dir}/attest.log on the host"))
            continue
        doc = o.value or {}
        docs[s.target.role] = doc
        # kept as the sidecar answered it (its digest is over exactly that content)
        attempt.add_json(f"attestation-{s.target.role}.json", doc)
        for f in findings(s, doc, deployment):
            problems.append(Problem(f"{s.target.alias}: {s.target.role}", f,
                                    "run `narwhal engines` again, then `narwhal attest`"))
    return docs, problems


def _summary(p: AttestPlan, docs: dict[str, dict[str, Any]],
             kept_roles: set[str]) -> dict[str, Any]:
    """engine-attestation.json: what each engine's sidecar attests, and whether it was kept."""
    url = {s.target.role: s.url for s in p.sidecars}
    return fleet_attestation({role: AttestedEngine(
        url=url[role], digest=d.get("digest"), compatibility_hash=d.get("compatibility_hash"),
        process=d.get("process"), sidecar="kept" if role in kept_roles else "started")
        for role, d in docs.items()}).document()


def execute(inputs: Inputs, sessions: Sessions, ledger: Ledger, attempt: Attempt,
            p: AttestPlan, progress: Progress) -> dict[str, Any]:
    remote = str(p.install["remote_dir"])
    router = sessions.get(p.router)
    router_tool = installed_tool(router, remote, COMMAND)
    key = controller_key(ledger)
    with attempt.bind(router):
        router_key = provision_key(router, p.install, key)

    earlier = previous_sidecars(ledger, attempt.id)
    kept_roles: set[str] = set()

    def attest(s: Sidecar) -> dict[str, Any]:
        with attempt.bind(router):
            kept = kept_attestation(p.previous.get(s.target.role), router, router_tool, s,
                                    inputs.deployment)
        if kept is not None:
            progress(s.target.role, f"still attests {str(kept['digest'])[:19]}: its sidecar "
                     "is kept")
            kept_roles.add(s.target.role)
            return kept
        host = sessions.get(s.target.alias)
        tool = installed_tool(host, remote, COMMAND)
        with attempt.bind(host):
            key_path = provision_key(host, p.install, key)
            retire(host, [r for r in earlier if r["host"] == s.target.alias
                           and r.get("serves", s.target.role) == s.target.role], progress,
                    s.target.role)
        progress(s.target.role, f"starting its sidecar on {s.target.alias}")
        attempt.start_process(host, [tool, "serve", "--run-dir", s.run_dir, "--deployment",
                                     inputs.deployment, "--bind", s.bind, "--port",
                                     str(s.port), "--lease-key-file", key_path],
                              f"{s.run_dir}/attest.log",
                              serves=s.target.role)
        with attempt.bind(router):
            doc = _fetch(router, router_tool, s.url)
        progress(s.target.role, f"attested {str(doc.get('digest', ''))[:19]} (from "
                 f"{p.router})")
        return doc

    docs, problems = _settled(each(p.sidecars, attest), attempt, inputs.deployment)
    summary = _summary(p, docs, kept_roles)
    attempt.add_json("engine-attestation.json", summary)
    if problems:
        attempt.block(problems=problems)
    fleet = finalised_fleet(p, docs, inputs.deployment, router_key)
    attempt.add_json("fleet-before.json", p.draft)
    attempt.add_json("fleet.json", fleet)
    return {"engines": summary["engines"], "router_host": p.router}


def quorum_members(sidecars: list[Sidecar]) -> list[Sidecar]:
    """The sidecars whose majority grants the controller lease: every one up to the fleet
    model's bound, past it an odd number chosen one host at a time (first sidecar of each
    host, then the second, ...), so losing one host costs the quorum as few members as it can
    and every lease asks a bounded number of sidecars however large the fleet."""
    if len(sidecars) <= QUORUM_MEMBERS_MAX:
        return list(sidecars)
    by_host: dict[str, list[Sidecar]] = {}
    for s in sidecars:
        by_host.setdefault(s.target.machine or s.target.alias, []).append(s)
    spread = [group[i] for i in range(max(map(len, by_host.values())))
              for group in by_host.values() if i < len(group)]
    count = QUORUM_MEMBERS_MAX if QUORUM_MEMBERS_MAX % 2 else QUORUM_MEMBERS_MAX - 1
    chosen = {id(s) for s in spread[:count]}
    return [s for s in sidecars if id(s) in chosen]


def finalised_fleet(p: AttestPlan, docs: dict[str, dict[str, Any]], deployment: str,
                    key_file: str) -> dict[str, Any]:
    """Gate A's draft with each engine's attestation URL and contract (what it attests) and,
    with three sidecars or more, the controller lease granted by a majority of them (the key
    file as the router host holds it); fewer keep the file lease."""
    by_role = {s.target.role: s for s in p.sidecars}
    engines = []
    for e in p.draft["engines"]:
        s, d = by_role[e["id"]], docs[e["id"]]
        engines.append({**e, "attestation_url": s.url, "contract": {
            "compatibility_hash": d["compatibility_hash"],
            "launch_record_sha256": d["launch_record_sha256"],
            "attestation_digest": d["digest"]}})
    fleet = {**p.draft, "engines": engines}
    if len(p.sidecars) >= MIN_QUORUM:
        fleet["controller"] = {**p.draft.get("controller", {}), "quorum": {
            "deployment": deployment, "key_file": key_file,
            "lease_urls": [s.lease_url for s in quorum_members(p.sidecars)]}}
    return checked_fleet(fleet, "fleet.json (Gate E)")
