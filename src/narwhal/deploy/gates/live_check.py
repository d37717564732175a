"""What `narwhal status` reads live besides the engines: the router and the Prometheus Gate G
left serving, and the directed links Gate D measured.

The record cannot see either move. The runbook's repeat rows name the work:
- "Router restart with the same fleet document": a router that no longer answers is started
  again on the fleet Gate F checked (`narwhal serve`), and before it accepts traffic it binds
  each saved profile to its engine's live generation; nothing before Gate G is repeated;
- Prometheus: Gate G passed only with every target `up` in a Prometheus it started (owned by
  pid and kernel start time, at the address its plan names); one that is gone, or runs but no
  longer answers its query API, leaves the fleet unwatched (no alert fires, the trial's scrape
  fails), so Gate G is stale until `narwhal serve` starts it again;
- "Fabric route, host assignment, or transport": a directed link whose measured facts (either
  end's interface, address or MTU, the kernel's route each way, the tool's version, the
  pinned host keys) differ
  from the link record Gate D sampled under is measured again, then the live KV paths are
  exercised in the full preflight. The other edges keep their samples (Gate D reuses a sample
  while its fingerprint holds), and the transport, test parameters and budget are inputs that
  Gate D's own fingerprint already follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from narwhal.core.errors import GateBlocked, LedgerError
from narwhal.core.fabric_edges import parse_links
from narwhal.deploy.gates import fabric
from narwhal.deploy.gates.handoff import attempt_plan, passed_artifact, passed_attempt
from narwhal.deploy.gates.owned_processes import alive, earlier_processes
from narwhal.deploy.gates.restarts import EngineChange
from narwhal.deploy.gates.serve import controller_of, fetch_json
from narwhal.deploy.gates.spec import Finding, Reads
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.hosts.trust import pinned_fingerprints
from narwhal.deploy.inputs.model import Inputs
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt
from narwhal.deploy.ledger.evidence import read_rows

LINKS = Reads("fabric", "links.json")
# The link record's fields read from the hosts: the interfaces, routes and tool, and the
# pinned host keys (a host whose key was replaced may be another machine: a new host
# assignment). The rest are inputs (transport, test parameters, budget) that Gate D's own
# fingerprint follows.
MEASURED = ("source_interface", "destination_interface", "route", "reverse_route",
            "tool_version", "host_keys")


@dataclass(frozen=True)
class LinkChange:
    edge: str
    moved: tuple[str, ...]  # the link record's fields that differ now

    def as_dict(self) -> dict[str, Any]:
        return {"edge": self.edge, "moved": list(self.moved), "repeat": list(self.repeat)}

    @property
    def repeat(self) -> tuple[str, ...]:
        return (f"fabric: sample {self.edge} again against its budget (`narwhal fabric`; "
                "the edges whose links did not move keep their samples)",
                "full preflight: narwhal-check on the router host exercises the live KV "
                "paths (gate F)")


@dataclass
class Live:
    """Everything the live check found; empty when nothing moved (or it did not run)."""

    engines: list[EngineChange] = field(default_factory=list)
    router: str = ""  # why the router Gate G left serving is not serving now
    prometheus: str = ""  # why the Prometheus Gate G started is not serving now
    links: list[LinkChange] = field(default_factory=list)
    # the pairs the router's live KV canary holds out of placement, with its evidence
    kv_pairs: list[dict[str, Any]] = field(default_factory=list)
    skipped: str = ""  # why (part of) the live check could not run

    def as_dict(self) -> dict[str, Any]:
        return {"engines_changed": [c.as_dict() for c in self.engines],
                "router": {"down": bool(self.router), "reason": self.router,
                           "repeat": list(ROUTER_REPEAT) if self.router else []},
                "prometheus": {"down": bool(self.prometheus), "reason": self.prometheus,
                               "repeat": list(PROMETHEUS_REPEAT) if self.prometheus else []},
                "links_moved": [c.as_dict() for c in self.links],
                "kv_pairs_held": [{**p, "repeat": list(KV_PAIR_REPEAT)} for p in self.kv_pairs]}


ROUTER_REPEAT = ("router: `narwhal serve` on the fleet gate F checked (a primary that serves is "
                 "adopted, a missing standby started); before it accepts traffic a new router "
                 "binds each saved profile to its engine's live generation",)
PROMETHEUS_REPEAT = ("prometheus: `narwhal serve` (or `narwhal deploy`) starts Prometheus again "
                     "with a fresh TSDB and checks every target up; the router serving is "
                     "adopted, nothing before Gate G is repeated",)


KV_PAIR_REPEAT = ("fabric: `narwhal fabric` samples the pair's edge again against its budget",
                  "full preflight: narwhal-check exercises every live KV path and records the "
                  "canary's reference again (gate F); the router frees the pair itself once its "
                  "probes pass")


def _role(state: tuple[int, dict[str, Any]] | None) -> str:
    return str(controller_of(state).get("role", "")) if state and state[0] == 200 else ""


def _router_urls(ledger: Ledger) -> list[str]:
    """The primary's and (planned) standby's addresses Gate G's last passed attempt left
    serving; [] before Gate G passed, or from a record before it planned its address."""
    attempt_id = passed_attempt(ledger, "serve")
    if attempt_id is None:
        return []
    plan = attempt_plan(ledger, "serve", attempt_id) or {}
    if not plan.get("router_url"):
        return []
    return [str(plan["router_url"]), *([str(plan["standby_url"])]
                                       if plan.get("standby_url") else [])]


RouterStates = dict[str, tuple[int, dict[str, Any]] | None]


def router_states(ledger: Ledger, router: Host, fetch_tool: str) -> RouterStates:
    """Each planned router address's /narwhal/state, asked once for every live finding."""
    return {u: fetch_json(router, fetch_tool, f"{u}/narwhal/state", 5)
            for u in _router_urls(ledger)}


def router_down(ledger: Ledger, router: Host, fetch_tool: str,
                states: RouterStates | None = None) -> str:
    """Why the routers Gate G's last passed attempt left serving are not serving now: no
    primary answers at the planned addresses, or, with a warm standby planned, none stands by
    (it took over when the primary died, or it is gone). "" when they serve as planned, or
    before Gate G passed. Whatever /ready says is not asked: the engines' own states are read
    separately."""
    if states is None:
        states = router_states(ledger, router, fetch_tool)
    urls = list(states)
    if not urls:
        return ""  # before Gate G passed, or a record from before it planned its address
    roles = {u: _role(got) for u, got in states.items()}
    primaries = [u for u, r in roles.items() if r == "primary"]
    if not primaries:
        ours = [r for r in earlier_processes(ledger, "serve", "", "narwhal-serve")
                if r["host"] == router.alias]
        running = [r for r in ours if alive(router, r)]
        which = (f"narwhal-serve pid {running[-1]['pid']} still runs but does not serve"
                 if running else "no narwhal-serve that gate G started runs there")
        return (f"the router at {' or '.join(urls)} on {router.alias} does not answer as "
                f"primary ({which})")
    if len(urls) == 2 and "standby" not in roles.values():
        other = next(u for u in urls if u not in primaries)
        took_over = primaries[0] == urls[1]
        return (f"no warm standby on {router.alias}: " + (
            f"the standby at {urls[1]} took over as primary and nothing stands by at {other}"
            if took_over else f"the standby at {other} does not answer"))
    return ""


def held_kv_pairs(states: RouterStates) -> list[dict[str, Any]]:
    """The producer -> consumer pairs the primary's live KV canary holds out of placement, each
    with its verdict, evidence and since when (wall clock); [] without a canary, or when no
    router answers as primary (router_down says that)."""
    primary = next((got[1] for got in states.values()
                    if got and got[0] == 200 and _role(got) == "primary"), None)
    canary = primary.get("kv_canary") if primary is not None else None
    pairs = canary.get("pairs") if isinstance(canary, dict) else None
    if not isinstance(pairs, dict):
        return []
    return [{"pair": str(name), "verdict": str(p.get("verdict")),
             "evidence": str(p.get("evidence"))[:300], "held_since": p.get("held_since")}
            for name, p in sorted(pairs.items()) if isinstance(p, dict) and p.get("held")]


def prometheus_reason(url: str, host: str, pid: int | None, running: bool | None,
                      answers: bool) -> str:
    """Why the Prometheus Gate G started is not serving ("" when it is): gone (its pid ended,
    or is another process now; whatever else answers at its address is not what Gate G
    checked), or running without answering its query API. `running` is None when the record
    names no process for it (a record from before Gate G owned one): the answer decides."""
    where = f"Prometheus at {url} on {host}"
    if running is False:
        return f"{where} is gone (pid {pid}, started by gate G, no longer runs" + (
            "; something else answers at that address)" if answers else ")")
    if answers:
        return ""
    return f"{where} does not answer its query API" + (
        f" (pid {pid} still runs)" if running else "")


def prometheus_down(ledger: Ledger, router: Host, fetch_tool: str) -> str:
    """Why the Prometheus Gate G's last passed attempt started is not serving now, asked on
    the router host: its process (pid and kernel start time) and its `up` query. "" when it
    serves, or before Gate G passed."""
    attempt_id = passed_attempt(ledger, "serve")
    if attempt_id is None:
        return ""
    folder = ledger.attempt_folder("serve", attempt_id)
    url = str((attempt_plan(ledger, "serve", attempt_id) or {}).get("prometheus_url") or "")
    if not url:
        return ""  # a record from before Gate G planned Prometheus's address: nothing to ask
    rows = [r for r in read_rows(folder / "owned.jsonl")
            if r.get("kind") == "process" and r.get("serves") == "prometheus"]
    running = alive(router, rows[-1]) if rows else None
    got = fetch_json(router, fetch_tool, f"{url}/api/v1/query?query=up", 5)
    answers = got is not None and got[0] == 200 and got[1].get("status") == "success"
    return prometheus_reason(url, router.alias, int(rows[-1]["pid"]) if rows else None,
                             running, answers)


def moved_links(inputs: Inputs, ledger: Ledger, sessions: Sessions,
                attempt: Attempt) -> list[LinkChange]:
    """The directed edges whose measured link facts differ from the record Gate D's last
    passed attempt sampled them under, read from both ends now (commands in `attempt`).
    The record is read through core's FabricLink (InputError naming the edge and field of a
    record that is not one)."""
    if passed_attempt(ledger, "fabric") is None:
        return []
    try:
        art = passed_artifact(ledger, "status", LINKS)
        recorded = parse_links(art.json(), str(art.path))
        p = fabric.plan(inputs, ledger, fabric.FabricOptions())
    except (GateBlocked, LedgerError):
        return []  # an upstream gate is not passed: the record's own states say so
    facts = {}
    for o in fabric.every_host_links(sessions, attempt, p):
        if o.error is not None:
            raise o.error
        assert o.value is not None
        facts[o.item] = o.value
    keys = {h: ",".join(sorted(pinned_fingerprints(sessions.known_hosts,
                                                   sessions.hosts[h].destination)))
            for h in p.hosts}
    now = fabric.link_records(p, facts, keys, fabric.transports(inputs, p))
    out = []
    for edge, rec in now.items():
        if edge not in recorded:
            continue  # an edge Gate D did not measure: its own fingerprint makes it stale
        doc, then = rec.document(), recorded[edge].record()
        moved = tuple(k for k in MEASURED if doc.get(k) != then.get(k))
        if moved:
            out.append(LinkChange(edge, moved))
    return out


def findings(live: Live) -> list[Finding]:
    """What the live check found, as the findings the gates' specs declare
    (deploy/gates/registry.py): an engine that must be captured again, or started again, and
    that its sidecar no longer vouches for; a moved link; a router or Prometheus not serving."""
    out: list[Finding] = []
    for c in live.engines:
        if c.restart:
            out.append(Finding("engine-down", c.engine, c.reason))
        elif c.recapture:
            out.append(Finding("engine-restarted", c.engine, c.reason))
    out += [Finding("engine-unattested", c.engine, c.reason) for c in live.engines]
    out += [Finding("link-moved", c.edge, ", ".join(c.moved)) for c in live.links]
    out += [Finding("router-down", "router", live.router)] if live.router else []
    out += [Finding("prometheus-down", "prometheus", live.prometheus)] if live.prometheus else []
    return out
