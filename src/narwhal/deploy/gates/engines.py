"""Gate C: validate and start every engine from its checked plan, and capture its live cache.

Plan (recorded first): per engine its host, GPUs and run dir on the host, and the start
order the runbook's concurrency rule gives: engines whose GPUs are disjoint start at once,
engines that share a GPU one after another. Execute, in two phases so that a bad host
blocks before any container exists: (1) on every host at once, `narwhal-engine prepare` and
`check` for each engine (the plan against the host now); (2) `start` and `capture` in the
planned order, each container owned by the attempt. Then the contract, on the workstation:
each engine's live hash and side-channel metadata against core/kv's prediction for its
launch record, and every ordered producer -> consumer pair by core/kv's pair rules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from narwhal.core import result_line
from narwhal.core.cache_layout import CacheLayout, parse_cache_layout
from narwhal.core.documents import canonical_json, stamp
from narwhal.core.errors import (
    ContractError,
    GateBlocked,
    HostError,
    InputError,
    LedgerError,
    Problem,
)
from narwhal.core.gpu_sharing import Allocation, share_groups
from narwhal.core.kv.capture.contract import (
    capture_findings,
    engine_findings,
    pair_problems,
    predicted,
)
from narwhal.core.kv.pair import check_fleet
from narwhal.core.launch_record import LaunchRecord
from narwhal.deploy.gates import engine_evidence
from narwhal.deploy.gates.handoff import Artifact, passed_artifact
from narwhal.deploy.gates.install import install_dir
from narwhal.deploy.gates.owned_processes import owned_containers
from narwhal.deploy.gates.parallel import each
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.gates.transfer import started_paths, transfer_paths
from narwhal.deploy.hosts.base import Host, RunResult
from narwhal.deploy.hosts.sessions import Sessions, physical_hosts
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt

INSTALL_PLAN = Reads("install", "plan.json")
DISCOVERY = Reads("discover", "discovery.json")
READS = (INSTALL_PLAN, DISCOVERY)  # its spec: gates/registry.py
COMMAND = "narwhal-engine"
START_TIMEOUT_S = 180.0
CAPTURE_TIMEOUT_S = 300.0
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class EngineTarget:
    role: str
    alias: str  # the SSH session (one per login) that reaches the engine's host
    record: LaunchRecord
    launch_sha256: str
    machine: str = ""  # the machine Gate A measured (discovery.json); "": the session's own

    def allocation(self) -> Allocation:
        return Allocation(self.role, self.machine or f"host:{self.alias}",
                          tuple(d.uuid for d in self.record.devices))


def with_machines(targets: list[EngineTarget], discovery: dict[str, Any]) -> list[EngineTarget]:
    """Each engine with the machine Gate A measured for it, so that two logins or addresses
    of one machine are one machine here too (a record from before it was measured: none)."""
    machines = {str(e.get("engine")): str(e.get("machine") or "")
                for e in discovery.get("engines") or []}
    return [replace(t, machine=machines.get(t.role, "")) for t in targets]


def start_groups(targets: list[EngineTarget]) -> list[list[EngineTarget]]:
    """Engines that share a GPU of one machine (directly or through others) in one group,
    started one after another; groups are started at once (core/gpu_sharing's rule)."""
    by_role = {t.role: t for t in targets}
    return [[by_role[role] for role in group]
            for group in share_groups([t.allocation() for t in targets])]


def targets_for(inputs: Inputs, ledger: Ledger, reader: str) -> list[EngineTarget]:
    """Every engine with its host and Gate A's launch record (for gate `reader`)."""
    host_of = {role: h.alias for h in physical_hosts(inputs) for role in h.roles}
    targets = []
    for e in inputs.engines:
        art = passed_artifact(ledger, reader, Reads("discover", f"launch-{e.role}.json"))
        targets.append(EngineTarget(e.role, host_of[e.role],
                                    LaunchRecord.model_validate_json(art.read_bytes()),
                                    art.sha256))
    return targets


def plan(inputs: Inputs, ledger: Ledger) -> tuple[list[EngineTarget], dict[str, Any]]:
    install = passed_artifact(ledger, "engines", INSTALL_PLAN).json()
    discovery = passed_artifact(ledger, "engines", DISCOVERY).json()
    targets = with_machines(targets_for(inputs, ledger, "engines"), discovery)
    groups = start_groups(targets)
    paths = transfer_paths(inputs, [(t.role, t.alias, t.record) for t in targets])
    doc = {"install": {"prepared_run": install["prepared_run"],
                       "remote_dir": install["remote_dir"]},
           "engines": [{"engine": t.role, "host": t.alias, "run_dir": f"{t.record.run_dir}/"
                        f"{t.role}", "gpus": [d.uuid for d in t.record.devices],
                        "launch_record_sha256": t.launch_sha256,
                        # the KV transfer path the engine is started on (Gate D measures it)
                        "transfer": paths[t.role].model_dump(mode="json")} for t in targets],
           "start_groups": [[t.role for t in g] for g in groups],
           # what a start may remove when a container holds its engine's name: only these
           "owned_containers": owned_containers(ledger, "engines")}
    return targets, doc


class Remote:
    """Paths and commands of one engine on its host (narwhal-engine from Gate B's venv)."""

    def __init__(self, host: Host, install: dict[str, Any], t: EngineTarget,
                 owned: list[str] | None = None, transfer: dict[str, Any] | None = None) -> None:
        self.owned = owned or []  # ID:CREATED of the containers the record owns on this host
        self.transfer = transfer  # the KV transfer path `prepare` builds the plan on
        base = install_dir(host, str(install["remote_dir"]))
        run = f"{base}/runs/{install['prepared_run']}"
        self.host, self.t = host, t
        self.tool = f"{base}/venv/bin/{COMMAND}"  # as installed_tool names it; $HOME read once
        self.launch, self.secrets = f"{run}/launch/{t.role}.json", f"{run}/secrets/env"
        self.run_dir = f"{t.record.run_dir}/{t.role}"

    def call(self, sub: str, *args: str, timeout: float = 120.0) -> result_line.ResultLine:
        done = self.host.run([self.tool, sub, *args], timeout=timeout)
        try:
            return result_line.parse(done.text, f"{COMMAND} {sub}")
        except ContractError:
            raise HostError(self.host.alias, f"{self.t.role}: `{COMMAND} {sub}` exited "
                            f"{done.exit_status} without a result line: "
                            f"{done.stderr.decode('utf-8', 'replace').strip()[-300:]}") from None


def running_probe(sessions: Sessions, ledger: Ledger, inputs: Inputs,
                  attempt: Attempt) -> Callable[[str], bool | None]:
    """For `narwhal status`: ask an engine's own host (`narwhal-engine state`, recorded in
    `attempt`) whether what Gate C started for it still runs; None when it cannot be asked."""
    install = passed_artifact(ledger, "status", INSTALL_PLAN).json()
    by_role = {t.role: t for t in targets_for(inputs, ledger, "status")}

    def running(role: str) -> bool | None:
        t = by_role.get(role)
        if t is None:
            return None
        try:
            host = sessions.get(t.alias)
            with attempt.bind(host):
                r = Remote(host, install, t)
                got = r.call("state", "--run-dir", r.run_dir)
        except HostError:
            return None
        return bool(got.data.get("running")) if got.ok else None

    return running


def _capture(r: Remote, attempt: Attempt, progress: Progress) -> CacheLayout:
    """`narwhal-engine capture` of the running engine, then its log and the capture's HTTP
    exchanges kept as evidence; kept too when the capture fails (they say why), without
    letting a failure to read them hide the capture's own error."""
    try:
        capture = _captured(r, attempt, progress)
    except (HostError, ContractError):
        with contextlib.suppress(HostError, ContractError, LedgerError):
            engine_evidence.keep(r.call, r.host, r.t.role, r.run_dir, attempt)
        raise
    engine_evidence.keep(r.call, r.host, r.t.role, r.run_dir, attempt)
    return capture


def _captured(r: Remote, attempt: Attempt, progress: Progress) -> CacheLayout:
    """`narwhal-engine capture` of the running engine; its capture kept as evidence."""
    t = r.t
    progress(t.role, "capturing")
    cap = r.call("capture", "--run-dir", r.run_dir, "--secrets", r.secrets,
                 "--timeout", str(int(CAPTURE_TIMEOUT_S)),
                 timeout=CAPTURE_TIMEOUT_S + 60)
    if not cap.ok:
        raise HostError(t.alias, f"{t.role}: capture failed: {cap.error}")
    # kept even when malformed
    attempt.add_json(f"cache-layout-{t.role}.json", cap.data["cache_layout"])
    try:
        capture = parse_cache_layout(cap.data["cache_layout"], f"{t.alias}: {t.role} capture")
    except InputError as exc:
        raise HostError(t.alias, f"{t.role}: capture is malformed: "
                        f"{exc.problems[0].line()}") from None
    progress(t.role, "captured")
    return capture


def _prepare_and_check(r: Remote, progress: Progress) -> list[Problem]:
    """`prepare` and `check` of one engine: the plan against its host now."""
    t = r.t
    progress(t.role, "checking")
    path = ["--transfer", canonical_json(r.transfer)] if r.transfer is not None else []
    prepared = r.call("prepare", "--launch", r.launch, "--run-dir", r.run_dir, *path,
                      "--secrets", r.secrets)
    if not prepared.ok:
        return [Problem(f"{t.alias}: {t.role}: prepare", prepared.error,
                        "the error names the file: the launch record Gate B installed, or "
                        f"the run dir {r.run_dir} (a full disk: free space there)")]
    result = r.call("check", "--run-dir", r.run_dir)
    return [] if result.ok else _check_problems(t, result)


def _start(r: Remote, attempt: Attempt, progress: Progress) -> CacheLayout:
    """`start` of one checked engine, owned by the attempt, then its capture."""
    t = r.t
    progress(t.role, "starting")
    owned = [a for c in r.owned for a in ("--replace-owned", c)]
    started = r.call("start", "--run-dir", r.run_dir, "--secrets", r.secrets, *owned,
                     timeout=START_TIMEOUT_S)
    if not started.ok:
        raise HostError(t.alias, f"{t.role}: start refused: {started.error}")
    for ran in started.data.get("commands", []):  # the host's `docker run`
        attempt.record_command(RunResult(
            t.alias, tuple(str(a) for a in ran["argv"]), int(ran["exit_status"]),
            b"", b"", float(ran["start"]), float(ran["end"])), "reported")
    if started.data["runtime"] != "native":
        attempt.own_container(r.host, str(started.data["runtime"]),
                              str(started.data["id"]), str(started.data["created"]))
    return _capture(r, attempt, progress)


def _restart(r: Remote, attempt: Attempt, progress: Progress) -> CacheLayout:
    """An engine started again from its checked plan: what is left of the last start
    removed first (`stop` touches only that container or process), then checked, started
    and captured as in a full run. Blocked, named, when the host fails the check."""
    t = r.t
    state = r.call("state", "--run-dir", r.run_dir)
    if state.ok and state.data.get("started"):
        progress(t.role, "removing what is left of its last start")
        stopped = r.call("stop", "--run-dir", r.run_dir, timeout=90)
        if not stopped.ok:
            raise HostError(t.alias, f"{t.role}: cannot remove its last start: {stopped.error}")
    problems = _prepare_and_check(r, progress)
    if problems:
        raise GateBlocked("engines", "; ".join(p.line() for p in problems[:2]), problems)
    return _start(r, attempt, progress)


def _check_problems(t: EngineTarget, result: result_line.ResultLine) -> list[Problem]:
    if not result.data.get("checks"):
        return [Problem(f"{t.alias}: {t.role}", result.error or "check failed",
                        "see the attempt's commands.jsonl")]
    return [Problem(f"{t.alias}: {t.role}: {c['check']}", str(c["found"]), c["fix"])
            for c in result.data["checks"] if not c["ok"]]


def execute(sessions: Sessions, attempt: Attempt, targets: list[EngineTarget],
            doc: dict[str, Any], progress: Progress) -> dict[str, Any]:
    install = doc["install"]
    remotes: dict[str, Remote] = {}

    def checked(t: EngineTarget) -> list[Problem]:
        host = sessions.get(t.alias)
        with attempt.bind(host):
            r = remotes[t.role] = Remote(host, install, t,
                                         doc.get("owned_containers", {}).get(t.alias),
                                         started_paths(doc).get(t.role))
            return _prepare_and_check(r, progress)

    problems: list[Problem] = []
    for outcome in each(targets, checked):
        if outcome.error is not None:
            if not isinstance(outcome.error, HostError):
                raise outcome.error
            problems.append(Problem(f"{outcome.item.alias}: {outcome.item.role}",
                                    str(outcome.error).splitlines()[0],
                                    "check the host is up (`narwhal hosts check`)"))
        else:
            problems += outcome.value or []
    if problems:
        attempt.block(problems=problems)

    captures: dict[str, CacheLayout] = {}

    def start_group(group: list[EngineTarget]) -> None:
        for t in group:
            r = remotes[t.role]
            with attempt.bind(r.host):
                captures[t.role] = _start(r, attempt, progress)

    for started in each(start_groups(targets), start_group):
        if started.error is not None:
            if not isinstance(started.error, (HostError, ContractError)):
                raise started.error
            problems.append(Problem(", ".join(t.role for t in started.item),
                                    str(started.error).splitlines()[0],
                                    "once started, an engine's log and what it answered are "
                                    "in this attempt (engine-log-<engine>.txt, "
                                    "http-<engine>.json); `narwhal recover engines` removes "
                                    "what this attempt started"))
    if problems:
        attempt.block(problems=problems)

    return judge(attempt, targets, captures)


def carried_captures(ledger: Ledger, targets: list[EngineTarget], roles: list[str]
                     ) -> dict[str, Artifact]:
    """For `--recapture ROLES`: the last passed attempt's capture of every other engine (a
    partial attempt that failed since replaced none of them), or InputError / GateBlocked
    before anything is recorded (an unknown role, no passed Gate C)."""
    unknown = sorted(set(roles) - {t.role for t in targets})
    if unknown or not roles:
        raise InputError("--recapture", [Problem("--recapture", f"{', '.join(unknown)!r} is "
                                                 "not an engine of this deployment", "use one "
                                                 "of: " + ", ".join(t.role for t in targets))])
    return {t.role: passed_artifact(ledger, "engines",
                                    Reads("engines", f"cache-layout-{t.role}.json"),
                                    through_failures=True)
            for t in targets if t.role not in roles}


def recapture(sessions: Sessions, attempt: Attempt, targets: list[EngineTarget],
              doc: dict[str, Any], carried: dict[str, Artifact],
              progress: Progress, restart: frozenset[str] = frozenset()) -> dict[str, Any]:
    """After a restart with the same launch plan: capture the named running engines again and
    carry every other engine's capture from the last passed attempt unchanged (its bytes and
    digest), then the whole contract again. The engines in `restart` (not running: crashed,
    or their host restarted) are started again from their checked plan first; nothing else
    is started or stopped, and an engine that is not running fails its capture by name. When
    the new captures keep the geometry, contract.json comes out byte for byte the same, so
    Gate D's fabric budget stays valid."""
    captures: dict[str, CacheLayout] = {}
    for role, art in carried.items():
        attempt.add_artifact(art.name, art.read_bytes())
        captures[role] = parse_cache_layout(art.json(), f"engines: {art.name}")
        progress(role, f"capture carried from attempt {art.attempt}")

    def again(t: EngineTarget) -> CacheLayout:
        host = sessions.get(t.alias)
        with attempt.bind(host):
            r = Remote(host, doc["install"], t, doc.get("owned_containers", {}).get(t.alias))
            return _restart(r, attempt, progress) if t.role in restart else \
                _capture(r, attempt, progress)

    problems: list[Problem] = []
    for o in each([t for t in targets if t.role not in carried], again):
        if o.error is None and o.value is not None:
            captures[o.item.role] = o.value
        elif isinstance(o.error, GateBlocked):
            problems += o.error.problems
        elif isinstance(o.error, (HostError, ContractError)):
            fix = ("read engine-log-<engine>.txt and http-<engine>.json in this attempt; "
                   "`narwhal recover engines` removes what this attempt started") \
                if o.item.role in restart else \
                ("is the engine running? `--recapture` reads the live engine; "
                 "`--restart` starts it again from its checked plan")
            problems.append(Problem(f"{o.item.alias}: {o.item.role}",
                                    str(o.error).splitlines()[0], fix))
        elif o.error is not None:
            raise o.error
    if problems:
        attempt.block(problems=problems)
    return judge(attempt, targets, captures)


def judge(attempt: Attempt, targets: list[EngineTarget],
          captures: dict[str, CacheLayout]) -> dict[str, Any]:
    """The live KV contract over every engine's capture (contract.json); blocked on a finding."""
    problems: list[Problem] = []
    geometries = []
    for t in targets:
        where, capture = f"{t.alias}: {t.role}", captures[t.role]
        problems += capture_findings(where, t.launch_sha256, capture)
        try:
            geometry = predicted(t.role, t.record, capture)
        except InputError as exc:
            problems += exc.problems
            continue
        geometries.append(geometry)
        problems += engine_findings(where, geometry, capture)
    problems += [p for report in check_fleet(geometries) for p in pair_problems(report)]
    contract = stamp("narwhal.engine-contract", 1, {
        "engines": {g.engine: {"compatibility_hash": g.compatibility_hash} for g in geometries},
        "findings": [{"field": p.field, "problem": p.problem, "fix": p.fix} for p in problems]})
    attempt.add_json("contract.json", contract)
    if problems:
        attempt.block("the live KV contract failed: " + "; ".join(
            p.line() for p in problems[:2]), problems)
    return {"engines": {t.role: {"host": t.alias, "version": captures[t.role].version,
                                 "compatibility_hash": captures[t.role].ranks[0]
                                 .compatibility_hash,
                                 "healthy_after_s": captures[t.role].healthy_after_s}
                        for t in targets}}
