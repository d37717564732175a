"""Gate D: prove the transfer fabric against the serving cache, one directed edge at a time.

Plan (recorded first): the budget of every directed edge between engine hosts, from the
geometry Gate C verified against each live engine and the workload inputs. Execute:
(1) link facts from both ends of every edge at once (interface, address, MTU, the kernel's
route each way, the tool's version), which with the host keys, transport, test parameters and
budget make each edge's link record and fingerprint; (2) the edges to sample (those whose
last sample did not pass under the same fingerprint) in windows of as many edges as one
producer has: every engine's idle proof, then for each edge in turn the consumer's iperf3
server (owned by the attempt) and the producer's client bound to the fabric addresses, then
every engine's idle proof again, which is also the next window's first; counters that moved
over a window send its edges to be sampled again one by one between proofs of their own, so
traffic voids only the samples it overlapped; a miss is diagnosed and the diagnosis recorded
with the sample; (3) the edge matrix document and its heatmap. The gate passes only when
every edge passes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from narwhal.core.cache_layout import parse_cache_layout
from narwhal.core.document_io import parse_json_bytes
from narwhal.core.documents import sha256_bytes
from narwhal.core.errors import (
    ContractError,
    GateBlocked,
    HostError,
    InputError,
    LedgerError,
    Problem,
)
from narwhal.core.fabric_edges import (
    checked_budget,
    checked_diagnosis,
    checked_edges,
    checked_links,
    checked_sample,
    parse_edges,
)
from narwhal.core.kv.capture.contract import predicted
from narwhal.core.transfer_path import TransferPath
from narwhal.deploy.fabric import diagnose as dx
from narwhal.deploy.fabric import iperf, matrix
from narwhal.deploy.fabric.budget import EdgeBudget, budget_document
from narwhal.deploy.fabric.links import Interface, LinkRecord, Route, parse_interface, parse_route
from narwhal.deploy.fabric.tools import Rdma, Tool
from narwhal.deploy.gates.engines import INSTALL_PLAN, EngineTarget, Remote, targets_for
from narwhal.deploy.gates.fabric_rules import (
    Reuse,
    edge_verdict,
    proof_windows,
    resample_refusal,
    sample_reuse,
)
from narwhal.deploy.gates.handoff import passed_artifact
from narwhal.deploy.gates.parallel import Outcome, each
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.gates.transfer import path_mismatches, started_paths, transfer_paths
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.hosts.trust import pinned_fingerprints
from narwhal.deploy.inputs.model import Inputs, Workload
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt

CONTRACT = Reads("engines", "contract.json")
# Which KV path each engine was started on (read to refuse measuring another; not a staleness
# input: an engine restarted on the same path keeps the fabric)
ENGINES_PLAN = Reads("engines", "plan.json")
READS = (INSTALL_PLAN, CONTRACT)  # its spec: gates/registry.py
Progress = Callable[[str, str], None]
SERVER_READY_S = 5.0
# An edge's matrix row, its diagnosis's causes, and the problem when its hosts failed it
Measured = tuple[matrix.EdgeRow, list[dx.Cause], Problem | None]


@dataclass(frozen=True)
class FabricOptions:
    """The test parameters (part of every link record: a change re-measures every edge)."""

    seconds: int = 10  # --seconds: client test time
    omit_s: int = 1  # --omit: the first seconds left out (TCP slow start)
    parallel: int = 1  # --parallel: client streams
    port: int = 5201  # --port: the consumer's test server port
    resample: tuple[str, ...] = ()  # --resample EDGE: measure again though it is reusable

    def parameters(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "omit_s": self.omit_s, "parallel": self.parallel,
                "port": self.port}


@dataclass
class FabricPlan:
    targets: list[EngineTarget]
    hosts: list[str]  # engine hosts, in fleet order
    edges: list[EdgeBudget]
    budget: dict[str, Any]
    install: dict[str, Any]
    options: FabricOptions
    workload: Workload
    address: dict[str, str] = field(default_factory=dict)  # host -> fabric address
    interface: dict[str, str] = field(default_factory=dict)  # host -> fabric interface
    run_dir: dict[str, str] = field(default_factory=dict)  # host -> Gate C's run dir there
    rdma: dict[str, Rdma | None] = field(default_factory=dict)  # host -> its HCA (ucx_rdma)
    paths: dict[str, TransferPath] = field(default_factory=dict)  # engine -> its KV path

    def tool(self, e: EdgeBudget) -> Tool:
        """ib_write_bw when both ends transfer over RDMA, else iperf3 (TCP)."""
        o, src, dst = self.options, self.rdma.get(e.source), self.rdma.get(e.destination)
        name = "ib_write_bw" if src is not None and dst is not None else "iperf3"
        return Tool(name, o.seconds, o.omit_s, o.parallel, o.port,
                    dst if name == "ib_write_bw" else None,
                    src if name == "ib_write_bw" else None)

    def document(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "addresses": self.address, "interfaces": self.interface,
                "edges": [e.edge for e in self.edges], "parameters": self.options.parameters(),
                "resample": list(self.options.resample), "budget": self.budget}


def plan(inputs: Inputs, ledger: Ledger, options: FabricOptions) -> FabricPlan:
    install = passed_artifact(ledger, "fabric", INSTALL_PLAN).json()
    targets = targets_for(inputs, ledger, "fabric")
    geometries = {}
    for t in targets:
        art = passed_artifact(ledger, "fabric", Reads("engines", f"cache-layout-{t.role}.json"))
        capture = parse_cache_layout(art.json(), f"engines: cache-layout-{t.role}.json")
        geometries[t.role] = predicted(t.role, t.record, capture)
    hosts = list(dict.fromkeys(t.alias for t in targets))
    if len(hosts) < 2:
        raise GateBlocked("fabric", f"the engines share one host ({hosts[0]}): there is no "
                          "fabric edge to prove; their handoffs stay on the host")
    doc, edges = budget_document(geometries, {t.role: t.alias for t in targets}, hosts,
                                 inputs.workload)
    p = FabricPlan(targets, hosts, edges, doc, install, options, inputs.workload)
    for t in targets:
        p.address.setdefault(t.alias, t.record.fabric_address)
        p.interface.setdefault(t.alias, t.record.fabric_interface)
        p.run_dir.setdefault(t.alias, t.record.run_dir)
    by_role = {e.role: e for e in inputs.engines}
    for t in targets:
        e = by_role[t.role]
        hca = Rdma.parse(e.transfer_net_devices or "") if e.transfer_transport == "ucx_rdma" \
            else None
        if hca is not None and t.alias not in p.rdma:
            facts = passed_artifact(ledger, "fabric",
                                    Reads("discover", f"host-facts-{t.alias}.json")).json()
            hca = hca.with_gid(list(facts.get("rdma") or []), t.record.fabric_address)
        p.rdma.setdefault(t.alias, hca)
        if e.transfer_transport == "ucx_rdma" and p.rdma[t.alias] is None:
            raise InputError("transport", [Problem(
                f"NARWHAL_NODE_{e.n}_TRANSFER_NET_DEVICES", "is empty, but the transport is "
                "ucx_rdma", "name the HCA port, e.g. mlx5_0:1")])
    p.paths = transfer_paths(inputs, [(t.role, t.alias, t.record) for t in targets])
    started = started_paths(passed_artifact(ledger, "fabric", ENGINES_PLAN).json())
    moved = path_mismatches([(e.edge, e.source, e.destination) for e in edges], p.paths,
                            started, {t.role: t.alias for t in targets})
    if moved:
        raise GateBlocked("fabric", f"{len(moved)} engine end(s) run on another KV path than "
                          f"the one this gate would measure: {moved[0].line()}", moved)
    unknown = [e for e in options.resample if e not in {x.edge for x in edges}]
    if unknown:
        raise InputError("--resample", [Problem(
            e, "is not a directed edge of this fleet",
            f"name one of {', '.join(x.edge for x in edges)}") for e in unknown])
    return p


# Link facts ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostLinks:
    interface: Interface | None
    routes: dict[str, Route]  # peer host -> this host's route to it
    tool_versions: dict[str, str]  # iperf3, and ib_write_bw on an RDMA host


def host_links(host: Host, p: FabricPlan) -> HostLinks:
    """One host's link facts as its kernel reports them now, in one round trip (also read by
    `narwhal status`, which compares them with the links Gate D measured)."""
    alias = host.alias
    iface, addr = p.interface[alias], p.address[alias]
    peers = [peer for peer in p.hosts if peer != alias]
    tools = ["iperf3", *(("ib_write_bw",) if p.rdma.get(alias) else ())]
    argv = cl.link_facts(iface, addr, [p.address[peer] for peer in peers], tools)
    got = host.run(argv)
    sections = cl.parse_sections(got.text)
    if not got.ok or len(sections) != 1 + len(peers) + len(tools):
        raise HostError(alias, "could not read its link facts (interface, routes, tool "
                        "versions)", command="link facts", exit_status=got.exit_status)
    shown, routed, versioned = sections[0], sections[1:1 + len(peers)], sections[1 + len(peers):]
    interface = parse_interface(shown[1], iface, addr) if shown[0] == 0 else None
    routes = {peer: parse_route(text) if status == 0 else Route("", None, None)
              for peer, (status, text) in zip(peers, routed, strict=True)}
    versions = {}
    for tool, (status, text) in zip(tools, versioned, strict=True):
        if status != 0:
            raise HostError(alias, f"{tool} is not installed (Gate D measures this host's "
                            "edges with it)", command=f"{tool} --version", exit_status=status)
        versions[tool] = text.strip()
    return HostLinks(interface, routes, versions)


def _missing_interface(name: str) -> Interface:
    return Interface(name, None, (), None, False)


def link_records(p: FabricPlan, facts: dict[str, HostLinks], keys: dict[str, str],
                 transport: dict[str, dict[str, Any]]) -> dict[str, LinkRecord]:
    out = {}
    for e in p.edges:
        s, d = facts[e.source], facts[e.destination]
        out[e.edge] = LinkRecord(
            edge=e.edge, source=e.source, destination=e.destination,
            source_address=p.address[e.source], destination_address=p.address[e.destination],
            source_interface=s.interface or _missing_interface(p.interface[e.source]),
            destination_interface=d.interface or _missing_interface(p.interface[e.destination]),
            route=s.routes[e.destination], reverse_route=d.routes[e.source],
            transport={"source": transport[e.source], "destination": transport[e.destination]},
            tool_version=s.tool_versions[p.tool(e).name],
            test_parameters=p.tool(e).parameters(),
            host_keys={e.source: keys[e.source], e.destination: keys[e.destination]})
    return out


# Previous samples ------------------------------------------------------------------------

def previous_rows(ledger: Ledger) -> dict[str, matrix.EdgeRow]:
    """Each edge's latest recorded row over the gate's earlier attempts (newest first), from
    edges.json files whose digest their attempt.json still vouches for (read through core's
    FabricEdges: InputError naming the file and field when one is not an edge matrix)."""
    entry = ledger.load().get("gates", {}).get("fabric", {}) if ledger.exists() else {}
    out: dict[str, matrix.EdgeRow] = {}
    for attempt in reversed(list(entry.get("attempts") or [])):
        folder = ledger.attempt_folder("fabric", attempt)
        try:
            recorded = json.loads((folder / "attempt.json").read_text())["artifacts"]
            data = (folder / "edges.json").read_bytes()
        except (OSError, ValueError, KeyError):
            continue  # an attempt that ended before its matrix: nothing to reuse from it
        if recorded.get("edges.json") != sha256_bytes(data):
            continue
        source = str(folder / "edges.json")
        for row in parse_edges(parse_json_bytes(data, source), source).edges:
            out.setdefault(row.edge, matrix.row_from(row.model_dump()))
    return out


def rejudged(inputs: Inputs, ledger: Ledger) -> str:
    """What a moved workload means for the saved samples: each edge's last passed sample held
    to the budget of now. Names the edges a deploy would measure again (with what they
    measured and now need); empty when the budget cannot be computed from the record."""
    try:
        p = plan(inputs, ledger, FabricOptions())
    except (GateBlocked, InputError, LedgerError, ContractError, OSError, ValueError):
        return ""
    prior = previous_rows(ledger)
    short = []
    for e in p.edges:
        last = prior.get(e.edge)
        got = last.measured_gbps if last is not None and last.verdict == "pass" else None
        if got is None or got < e.required_gbps:
            short.append(f"{e.edge} ({'no passed sample' if got is None else f'{got:.3f}'}"
                         f" of {e.required_gbps:.3f} Gbit/s needed)")
    if not short:
        return "every saved sample meets the new budget: judged again, none measured"
    return "measure again: " + ", ".join(short)


# One edge --------------------------------------------------------------------------------

class Fabric:
    """Everything one run of the gate uses while it measures edges one at a time."""

    def __init__(self, sessions: Sessions, attempt: Attempt, p: FabricPlan,
                 progress: Progress) -> None:
        self.sessions, self.attempt, self.p, self.progress = sessions, attempt, p, progress
        self.remotes = {t.role: Remote(sessions.get(t.alias), p.install, t) for t in p.targets}
        # The proof taken after one sample is the proof before the next: between them the
        # gate runs nothing on the engines, and one read of every engine per edge is saved.
        self.last_proof: dict[str, dict[str, Any]] | None = None

    def _idle(self) -> dict[str, dict[str, Any]]:
        def one(t: EngineTarget) -> dict[str, Any]:
            r = self.remotes[t.role]
            with self.attempt.bind(r.host):
                got = r.call("idle", "--run-dir", r.run_dir, timeout=30)
            if not got.ok:
                raise HostError(t.alias, f"{t.role}: idle proof failed: {got.error}")
            return dict(got.data)

        proofs = {}
        for o in each(self.p.targets, one):
            if o.error is not None:
                raise o.error
            proofs[o.item.role] = o.value or {}
        return proofs

    @staticmethod
    def traffic(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
                ) -> list[str]:
        out = []
        for engine in sorted(before):
            b, a = before[engine], after[engine]
            for when, proof in (("before", b), ("after", a)):
                for name, value in (proof.get("busy") or {}).items():
                    out.append(f"{engine}: {name} = {value:g} {when} the sample")
            for name, value in (a.get("counters") or {}).items():
                delta = value - float((b.get("counters") or {}).get(name, value))
                if delta > 0:
                    out.append(f"{engine}: {name} rose by {delta:g} during the sample")
        return out

    def _port_owner(self, host: Host) -> str | None:
        got = host.run(["ss", "-Hltnp", f"sport = :{self.p.options.port}"])
        line = got.text.strip().splitlines()[0] if got.ok and got.text.strip() else ""
        return line.split("users:", 1)[-1].strip() or "an unknown process" if line else None

    def _wait_listening(self, host: Host) -> bool:
        deadline = time.monotonic() + SERVER_READY_S
        while time.monotonic() < deadline:
            got = host.run(["ss", "-Hltn", f"sport = :{self.p.options.port}"])
            if got.ok and got.text.strip():
                return True
            time.sleep(0.05)
        return False

    def _sample(self, e: EdgeBudget, link: LinkRecord, src: Host, dst: Host
                ) -> tuple[dx.Outcome, str]:
        """One sample: the consumer's test server (owned by the attempt, ended after), the
        producer's client bound to the fabric addresses; the outcome and the client's report."""
        tool = self.p.tool(e)
        server = self.attempt.start_process(
            dst, tool.server(link.destination_address),
            f"{self.p.run_dir[e.destination]}/fabric-{tool.name}.log")
        with self.attempt.bind(dst):
            listening = self._wait_listening(dst)
        try:
            with self.attempt.bind(src):
                ran = src.run(tool.client(link.source_address, link.destination_address),
                              timeout=tool.timeout_s)
        finally:
            with self.attempt.bind(dst):
                if dst.process_start(server.pid) == server.start_ticks:
                    dst.signal(server.pid)
        parsed = tool.parse(ran.text, ran.stderr.decode("utf-8", "replace"), ran.exit_status)
        return dx.Outcome(sample=None if isinstance(parsed, iperf.IperfError) else parsed,
                          error=parsed if isinstance(parsed, iperf.IperfError) else None,
                          listening=listening), ran.text

    def _run(self, e: EdgeBudget, link: LinkRecord) -> tuple[dx.Outcome, str]:
        """One edge's sample, its server's port checked first; no idle proof (the window's)."""
        src, dst = self.sessions.get(e.source), self.sessions.get(e.destination)
        self.progress(e.edge, "measuring")
        with self.attempt.bind(dst):
            owner = self._port_owner(dst)
        if owner is not None:
            return dx.Outcome(port_owner=owner), ""
        return self._sample(e, link, src, dst)

    def measure(self, window: list[tuple[EdgeBudget, LinkRecord]]) -> list[Measured]:
        """The window's edges one at a time between two idle proofs of every engine (the
        rule is that no engine serves while any edge is sampled, and counters that did not
        move over the window show it for each sample in it). When they moved, each edge of
        a window of several is sampled again between proofs of its own, so the traffic
        voids only the samples it overlapped. An idle proof that cannot be taken fails the
        window's edges, naming the host."""
        try:
            before = self.last_proof if self.last_proof is not None else self._idle()
        except (HostError, ContractError) as exc:
            return [self._failed(e, link, exc) for e, link in window]
        ran: list[tuple[EdgeBudget, LinkRecord, dx.Outcome | Exception, str]] = []
        for e, link in window:
            try:
                ran.append((e, link, *self._run(e, link)))
            except (HostError, ContractError) as exc:
                ran.append((e, link, exc, ""))
        try:
            after = self.last_proof = self._idle()
        except (HostError, ContractError) as exc:
            self.last_proof = None
            return [self._failed(e, link, exc) for e, link in window]
        traffic = self.traffic(before, after)
        if traffic and len(window) > 1:
            return [row for item in window for row in self.measure([item])]
        proofs = {"before": before, "after": after}
        return [self._failed(e, link, o) if isinstance(o, Exception) else
                (*self._record(e, link, dx.Outcome(o.sample, o.error, o.listening,
                                                   o.port_owner, traffic), raw, proofs), None)
                for e, link, o, raw in ran]

    def _failed(self, e: EdgeBudget, link: LinkRecord, exc: Exception) -> Measured:
        """An edge whose sample could not run on its hosts."""
        return (matrix.EdgeRow(e.edge, e.source, e.destination, e.required_gbps, None, "fail",
                               link.fingerprint, self.attempt.id, False, None, None,
                               ("host",)), [],
                Problem(e.edge, str(exc).splitlines()[0], "check the hosts"))

    def unmeasured(self, e: EdgeBudget, link: LinkRecord
                   ) -> tuple[matrix.EdgeRow, list[dx.Cause]]:
        """An edge whose route is not the fabric: recorded, never sampled."""
        self.progress(e.edge, "not measured: the route is not the fabric")
        return self._record(e, link, dx.Outcome(), "", {})

    def _record(self, e: EdgeBudget, link: LinkRecord, outcome: dx.Outcome, raw: str,
                proofs: dict[str, Any]) -> tuple[matrix.EdgeRow, list[dx.Cause]]:
        """The edge's verdict, its sample (and diagnosis) as evidence, and its matrix row."""
        name = f"edge-{e.source}-to-{e.destination}"
        measured = outcome.sample.gbps if outcome.sample is not None else None
        verdict = edge_verdict(measured, e.required_gbps, route_ok=not link.route_problems(),
                               traffic=bool(outcome.traffic))
        causes = [] if verdict == "pass" else dx.diagnose(link, outcome, e.required_gbps,
                                                          self.p.options.port)
        self.attempt.add_json(f"{name}.json", checked_sample(
            {"edge": e.edge, "link_fingerprint": link.fingerprint,
             "required_gbps": e.required_gbps, "measured_gbps": measured, "verdict": verdict,
             "idle_proof": proofs, "client_report": _json_or_text(raw)}, f"{name}.json"))
        diagnosis = None
        if causes:  # recorded with the sample, before any resample can be asked for
            diagnosis = f"{name}.diagnosis.json"
            self.attempt.add_json(diagnosis, checked_diagnosis(
                dx.document(e.edge, causes, f"{name}.json"), diagnosis))
        self.progress(e.edge, verdict + (f" {measured:.3f} Gbit/s" if measured is not None
                                         else "") + f" (needs {e.required_gbps:.4f})")
        return matrix.EdgeRow(e.edge, e.source, e.destination, e.required_gbps, measured,
                              verdict, link.fingerprint, self.attempt.id, False,
                              f"{name}.json", diagnosis,
                              tuple(c.cause for c in causes)), causes


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw[-4000:]


def transports(inputs: Inputs, p: FabricPlan) -> dict[str, dict[str, Any]]:
    """Each host's end of its links: the transport settings and the UCX environment its
    engines move KV with (the path measured; a moved path moves the link's fingerprint)."""
    by_role = {e.role: e for e in inputs.engines}
    out: dict[str, dict[str, Any]] = {}
    for t in p.targets:
        e = by_role[t.role]
        path = p.paths.get(t.role)
        out.setdefault(t.alias, {"transport": e.transfer_transport,
                                 "net_devices": e.transfer_net_devices,
                                 "ucx": path.environment() if path is not None else {}})
    return out


def every_host_links(sessions: Sessions, attempt: Attempt, p: FabricPlan
                     ) -> list[Outcome[str, HostLinks]]:
    """Every engine host's link facts at once, one round trip each (commands in `attempt`);
    also read by `narwhal status`."""
    def facts_of(alias: str) -> HostLinks:
        host = sessions.get(alias)
        with attempt.bind(host):
            return host_links(host, p)

    return each(p.hosts, facts_of)


def _all_host_links(sessions: Sessions, attempt: Attempt, p: FabricPlan
                    ) -> dict[str, HostLinks]:
    """Every engine host's link facts at once; blocked naming each host that cannot say."""
    facts: dict[str, HostLinks] = {}
    problems: list[Problem] = []
    for o in every_host_links(sessions, attempt, p):
        if o.error is not None:
            if not isinstance(o.error, (HostError, ValueError)):
                raise o.error
            problems.append(Problem(o.item, str(o.error).splitlines()[0],
                                    "check the host (`narwhal hosts check`)"))
        else:
            assert o.value is not None
            facts[o.item] = o.value
    if problems:
        attempt.block(problems=problems)
    return facts


def _links(inputs: Inputs, sessions: Sessions, attempt: Attempt, p: FabricPlan
           ) -> dict[str, LinkRecord]:
    """Every edge's link record from both ends' facts now, kept as links.json."""
    facts = _all_host_links(sessions, attempt, p)
    keys = {h: ",".join(sorted(pinned_fingerprints(sessions.known_hosts,
                                                   sessions.hosts[h].destination)))
            for h in p.hosts}
    links = link_records(p, facts, keys, transports(inputs, p))
    attempt.add_json("links.json", checked_links(
        {edge: {**rec.document(), "fingerprint": rec.fingerprint}
         for edge, rec in links.items()}))
    return links


def _edge_problem(row: matrix.EdgeRow, causes: list[dx.Cause]) -> Problem:
    """A failed or void edge as the gate's problem: the rate against the budget, and the
    first cause its diagnosis found."""
    first = causes[0] if causes else None
    return Problem(
        row.edge, f"{row.verdict}: " + (f"{row.measured_gbps:.4f} Gbit/s of "
                                        f"{row.required_gbps:.4f} required; "
                                        if row.measured_gbps is not None else "")
        + (f"{first.cause}: {first.found}" if first else "no sample"),
        first.fix if first else "see the edge's sample in the attempt")


def execute(inputs: Inputs, sessions: Sessions, ledger: Ledger, attempt: Attempt,
            p: FabricPlan, progress: Progress) -> dict[str, Any]:
    attempt.add_json("budget.json", checked_budget(p.budget))
    prior = previous_rows(ledger)
    for asked in p.options.resample:
        last = prior.get(asked)
        refused = resample_refusal(asked, last, last is not None and last.diagnosis is not None)
        if refused:
            raise GateBlocked("fabric", refused)

    links = _links(inputs, sessions, attempt, p)
    fabric = Fabric(sessions, attempt, p, progress)
    done: dict[str, Measured] = {}
    sampled: list[tuple[EdgeBudget, LinkRecord]] = []
    for e in p.edges:
        link = links[e.edge]
        last = prior.get(e.edge)
        if last is not None and sample_reuse(last, link.fingerprint, e.required_gbps,
                                             e.edge in p.options.resample) is Reuse.REUSED:
            progress(e.edge, f"reused from attempt {last.measured_in} (same link; "
                     f"{last.measured_gbps:.3f} Gbit/s meets the {e.required_gbps:.3f} required)")
            done[e.edge] = (matrix.EdgeRow(e.edge, e.source, e.destination, e.required_gbps,
                                           last.measured_gbps, "pass", link.fingerprint,
                                           last.measured_in, True, last.sample, None), [], None)
        elif link.route_problems():
            done[e.edge] = (*fabric.unmeasured(e, link), None)
        else:
            sampled.append((e, link))
    for window in proof_windows(sampled, len(p.hosts)):
        done.update((row.edge, (row, causes, failed))
                    for row, causes, failed in fabric.measure(window))
    rows = [done[e.edge][0] for e in p.edges]
    problems: list[Problem] = []
    for row, causes, failed in (done[e.edge] for e in p.edges):
        if failed is not None:
            problems.append(failed)
        if row.verdict != "pass":
            problems.append(_edge_problem(row, causes))
    attempt.add_json("edges.json", checked_edges(matrix.edges_document(rows, p.hosts)))
    attempt.add_artifact("edge-matrix.png", matrix.heatmap_png(rows, p.hosts))
    if problems:
        attempt.block(problems=problems)
    return {"edges": [r.document() for r in rows], "hosts": p.hosts}
