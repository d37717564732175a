"""Gate A: freeze the inputs and discover the real deployment (`narwhal discover`).

Plan: which hosts to inspect and what to ask each (the probe request), recorded as plan.json
before any host is touched. Execute: every physical host and the workstation inspected at
once by one stdlib-only probe (node/host_probe.py, shipped as a file over the host's session,
its request on stdin, one result line back), each host's facts kept as evidence, then every
engine's allocation checked against its own host's facts. Only when nothing is wrong is the
generated configuration written: per-engine launch records, the derived plan and a draft
fleet document. A blocked attempt writes the problems, never a generated file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core import result_line
from narwhal.core.documents import canonical_json, stamp
from narwhal.core.errors import (
    ClientToolMissing,
    ContractError,
    HostError,
    Problem,
)
from narwhal.core.host_facts import parse_host_facts
from narwhal.deploy.checkpoint import gate_a
from narwhal.deploy.gates import discover_checks as checks
from narwhal.deploy.gates import tokenizer
from narwhal.deploy.gates.generated import fleet_draft, launch_record
from narwhal.deploy.gates.parallel import each
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions, physical_hosts
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger.attempt import Attempt

PROBE_COMMAND = "narwhal-host-probe"
# The probe's source is sent to hosts on stdin and run there; deploy never imports node code.
PROBE_FILE = Path(__file__).resolve().parents[2] / "node" / "host_probe.py"
PROBE_TIMEOUT_S = 900.0  # hashing a large checkpoint is the long part
REQUEST_SCHEMA = "narwhal.host-probe-request"
DISCOVERY_SCHEMA = "narwhal.discovery"
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class ProbeTarget:
    """One host to inspect and what to ask it."""

    alias: str
    role: str  # engine | router | workstation
    request: dict[str, Any]


def plan(inputs: Inputs) -> list[ProbeTarget]:
    """Every physical host (engine hosts hash their checkpoint) and the workstation."""
    targets = []
    for host in physical_hosts(inputs):
        engines = [e for e in inputs.engines if e.role in host.roles]
        first = engines[0] if engines else None
        ports = sorted({p for e in engines
                        for p in (e.engine_port, e.attest_port, e.nixl_side_channel_port,
                                  e.kv_events_port) if p is not None})
        targets.append(ProbeTarget(host.alias, "engine" if engines else "router", {
            "schema": REQUEST_SCHEMA, "schema_version": 1,
            "role": "engine" if engines else "router",
            "run_dir": first.run_dir if first else None,
            "model_dir": first.model_dir if first else None,
            "fabric_interface": first.fabric_interface if first else None,
            "ports": ports, "image": first.engine_image if first else None,
            "runtime": "docker" if first else None, "hash_model": first is not None}))
    targets.append(ProbeTarget("workstation", "workstation", {
        "schema": REQUEST_SCHEMA, "schema_version": 1, "role": "workstation", "run_dir": None,
        "model_dir": None, "fabric_interface": None, "ports": [], "image": None,
        "runtime": None, "hash_model": False}))
    return targets


def _colocated_dirs(inputs: Inputs) -> list[Problem]:
    """One probe per host reads one model and run dir; colocated engines must share them."""
    problems = []
    for host in physical_hosts(inputs):
        engines = [e for e in inputs.engines if e.role in host.roles]
        for e in engines[1:]:
            for name, attr in (("MODEL_DIR", "model_dir"), ("RUN_DIR", "run_dir"),
                               ("ENGINE_IMAGE", "engine_image"),
                               ("FABRIC_INTERFACE", "fabric_interface")):
                if getattr(e, attr) != getattr(engines[0], attr):
                    problems.append(Problem(
                        f"{host.alias}: NARWHAL_NODE_{e.n}_{name}",
                        f"differs from {engines[0].role} on the same host",
                        f"colocated engines share one {name.lower().replace('_', ' ')}"))
    return problems


def probe(host: Host, target: ProbeTarget, code: bytes) -> dict[str, Any]:
    """Run the probe, sent on stdin ahead of its request (one round trip, no file left on the
    host); the validated facts."""
    run = host.run(cl.stdin_program(PROBE_COMMAND), timeout=PROBE_TIMEOUT_S,
                   stdin=cl.stdin_program_input(code, json.dumps(target.request).encode()))
    if run.exit_status == 127:
        raise ContractError(f"{target.alias}: python3 is not installed (the probe needs it)")
    result = result_line.parse(run.text, PROBE_COMMAND)
    if not result.ok:
        raise ContractError(f"{target.alias}: the probe refused its request: {result.error}")
    facts = parse_host_facts(result.data, target.alias)
    return dict(facts.model_dump(mode="json", by_alias=True))


def _host_error(alias: str, exc: Exception) -> Problem:
    """A host that could not be inspected: what went wrong there, and the way out."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, ContractError):
        fix = ("install python3 (3.8 or newer runs the probe; engines need 3.11) on the host"
               if "python3 is not installed" in text else
               "run discovery from one Narwhal checkout; the probe and its reader must match")
        return Problem(f"{alias}: probe", text, fix)
    if isinstance(exc, ClientToolMissing):
        fix = checks.SSHPASS_FIX if exc.tool == "sshpass" else \
            "install the OpenSSH client on the workstation"
        return Problem(f"{alias}: ssh", text, fix)
    fix = ("verify the new key out of band, then `narwhal hosts trust --replace " + alias + "`"
           if "key" in type(exc).__name__.lower() else
           "check the host is up and reachable over SSH (`narwhal hosts check`)")
    return Problem(f"{alias}: ssh", text, fix)


def execute(inputs: Inputs, sessions: Sessions, attempt: Attempt,
            targets: list[ProbeTarget], progress: Progress,
            staging: gate_a.StagePlan | None = None) -> dict[str, Any]:
    code = PROBE_FILE.read_bytes()
    problems = _colocated_dirs(inputs)

    def one(target: ProbeTarget) -> dict[str, Any]:
        progress(target.alias, "inspecting")
        host = sessions.get(target.alias)
        with attempt.bind(host):
            facts = probe(host, target, code)
        progress(target.alias, "inspected")
        return facts

    def probe_all(chosen: list[ProbeTarget]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for outcome in each(chosen, one):
            alias = outcome.item.alias
            if outcome.error is not None:
                if not isinstance(outcome.error, (HostError, ContractError)):
                    raise outcome.error
                progress(alias, "failed")
                problems.append(_host_error(alias, outcome.error))
                continue
            assert outcome.value is not None
            found[alias] = outcome.value
        return found

    facts = probe_all(targets)
    if staging is not None:
        problems += gate_a.run(inputs, sessions, attempt, staging, facts, lambda aliases: probe_all(
            [t for t in targets if t.alias in aliases]), progress)
    for alias, doc in facts.items():
        attempt.add_json(f"host-facts-{alias}.json", doc)
    host_of = {role: h.alias for h in physical_hosts(inputs) for role in h.roles}
    engine_facts = {a: f for a, f in facts.items() if a != "workstation"}
    found, plans = checks.all_problems(inputs, engine_facts, host_of, facts.get("workstation"))
    problems += found
    kept: dict[str, bytes] = {}
    if not problems:
        kept, found = router_tokenizer(sessions, attempt, plans, facts)
        problems += found
    if problems:
        attempt.block(problems=problems)
    draft = fleet_draft(inputs, plans)  # validated first: a bad draft leaves nothing written
    discovery = stamp(DISCOVERY_SCHEMA, 1, {
        "deployment": inputs.deployment, "engines": [p.as_json() for p in plans],
        "workstation": {k: facts["workstation"].get(k) for k in ("hostname", "python", "tools")}
        if "workstation" in facts else None,
        # the staged revision and its model card; absent when nothing is staged, so records
        # of fleets that copy their checkpoint stay as they were
        **({"checkpoint": gate_a.discovered(staging)} if staging is not None else {})})
    attempt.add_json("discovery.json", discovery)
    for p in plans:
        attempt.add_json(f"launch-{p.engine.role}.json", launch_record(inputs, p))
    attempt.add_json("fleet-draft.json", draft)
    for name, data in kept.items():
        attempt.add_artifact(name, data)
    return discovery


def router_tokenizer(sessions: Sessions, attempt: Attempt, plans: list[checks.EnginePlan],
                     facts: dict[str, dict[str, Any]]) -> tuple[dict[str, bytes], list[Problem]]:
    """When an engine publishes KV events: the checkpoint's tokenizer files, read from that
    engine's host and held to what the probe measured, with their manifest (gates/tokenizer.py
    says why the router needs them); nothing otherwise."""
    src = tokenizer.source(plans)
    if src is None:
        return {}, []
    files = tokenizer.wanted(facts.get(src.host) or {})
    problems = tokenizer.missing(src, files)
    if problems:
        return {}, problems
    host = sessions.get(src.host)
    try:
        with attempt.bind(host):
            data = tokenizer.fetch(host, src.engine.model_dir, files)
    except HostError as exc:
        return {}, [tokenizer.read_failed(src, exc)]
    manifest = canonical_json(tokenizer.manifest(src, files)).encode() + b"\n"
    return {**data, tokenizer.MANIFEST: manifest}, []
