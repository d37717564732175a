"""Gate G, the service: narwhal-serve and its monitoring on the router host (`narwhal serve`).

Plan (recorded first): the router host, the router's address (from NARWHAL_ROUTER_URL, else
127.0.0.1:8000: the private path, reached through the tunnel), Prometheus's address, and every
scrape target. Execute, over the router host's session:
1. the fleet there must be the one Gate F checked (its sha256), profiles and calibration beside;
2. the router: a primary router of this fleet already answering at the address is adopted
   (one controller, never a second); otherwise narwhal-serve starts detached, owned by the
   attempt, alive after the command exits, and must answer /ready; if it exits instead (another
   router holds the controller lease), the gate is blocked with its words, which name the holder;
3. through an SSH forward from the workstation (the private path): /ready and one completion
   with its own x-request-id (first, so that its series are in Prometheus's first scrape);
4. the monitoring, generated from the fleet: promtool checks the configuration and the alert
   rules and runs the rules' own tests; Prometheus (native) starts detached with a fresh TSDB,
   replacing the one an earlier attempt started, and every target must be `up` == 1, which
   Prometheus's `up` through the same forward must also show; the Grafana provisioning is
   checked against the dashboard model offline, and every panel's query must return series
   from the live Prometheus (Grafana itself is not started here: SKIP).
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from narwhal.core import result_line
from narwhal.core.errors import ContractError, GateBlocked, HostError, Problem
from narwhal.deploy.gates import monitoring
from narwhal.deploy.gates.engines import INSTALL_PLAN
from narwhal.deploy.gates.handoff import attempt_plan, passed_artifact
from narwhal.deploy.gates.install import install_dir, installed_tool
from narwhal.deploy.gates.owned_processes import alive, earlier_processes, retire
from narwhal.deploy.gates.serve_rules import Answer, adoption, strays, url_of
from narwhal.deploy.gates.spec import Reads
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.base import Host
from narwhal.deploy.hosts.forward_http import forwarded, http
from narwhal.deploy.inputs.model import DEFAULT_ROUTER_URL, Inputs
from narwhal.deploy.inputs.urls import url_bind
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.attempt import Attempt

FLEET = Reads("preflight", "fleet-calibrated.json")
READS = (INSTALL_PLAN, FLEET)  # its spec: gates/registry.py
SERVE, FETCH = "narwhal-serve", "narwhal-attest"
PROMETHEUS, PROMTOOL = "prometheus", "promtool"
PROMETHEUS_AT = ("127.0.0.1", 9090)
READY_S, UP_S, BOUND_S = 60.0, 45.0, 20.0
# How long the private path's /ready may take to say 200. A router that has just started can
# miss its first lease renewals while it loads a large fleet (its quorum asks each sidecar
# with a timeout of ttl/8) and take the lease again: one answer at one instant proves less
# than the first 200 within this bound.
TUNNEL_READY_S = 15.0
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class ServePlan:
    router: str
    install: dict[str, Any]
    fleet: dict[str, Any]
    fleet_sha256: str
    bind: tuple[str, int]  # the primary router's address on the router host
    standby: tuple[str, int] | None = None  # the warm standby's, when there is one
    # NARWHAL_PROMETHEUS_LISTEN_ADDRESS: what Prometheus binds, and where it is reached from
    # the router host (an empty or wildcard host there is reached on loopback)
    prometheus_listen: str = f"{PROMETHEUS_AT[0]}:{PROMETHEUS_AT[1]}"
    grafana_bind: str | None = None  # NARWHAL_GRAFANA_BIND_ADDRESS, in Grafana's server.ini

    @property
    def router_url(self) -> str:
        return url_of(self.bind)

    @property
    def standby_url(self) -> str | None:
        return url_of(self.standby) if self.standby else None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [self.bind, *([self.standby] if self.standby else [])]

    @property
    def prometheus_at(self) -> tuple[str, int]:
        """Where the router host reaches Prometheus (the SSH forward's far end too)."""
        return monitoring.reached_at(self.prometheus_listen)

    @property
    def prometheus_url(self) -> str:
        host, port = self.prometheus_at
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def targets(self) -> list[monitoring.Target]:
        return monitoring.targets(self.fleet, *(f"{h}:{port}" for h, port in self.addresses))

    def document(self) -> dict[str, Any]:
        return {"router_host": self.router, "router_url": self.router_url,
                "standby_url": self.standby_url,
                "prometheus_url": self.prometheus_url,
                "prometheus_listen": self.prometheus_listen, "grafana_bind": self.grafana_bind,
                "fleet_sha256": self.fleet_sha256,
                "targets": [{"job": t.job, "address": t.address, "engine": t.engine}
                            for t in self.targets()]}


def plan(inputs: Inputs, ledger: Ledger, router_host: str) -> ServePlan:
    install = passed_artifact(ledger, "serve", INSTALL_PLAN).json()
    art = passed_artifact(ledger, "serve", FLEET)
    bind = url_bind(inputs.router.url or DEFAULT_ROUTER_URL)
    standby = url_bind(inputs.router.standby_url) if inputs.router.standby_url else None
    listen = inputs.prometheus_listen_address or f"{PROMETHEUS_AT[0]}:{PROMETHEUS_AT[1]}"
    return ServePlan(router_host, install, art.json(), art.sha256, bind, standby, listen,
                     inputs.grafana_bind_address)


def fetch_json(host: Host, fetch_tool: str, url: str,
               timeout_s: int = 3) -> tuple[int, dict[str, Any]] | None:
    """GET a JSON document from `host` with the installed `narwhal-attest fetch`: (status,
    document), or None when nothing answers there."""
    done = host.run([fetch_tool, "fetch", "--url", url, "--timeout", str(timeout_s)],
                    timeout=30)
    try:
        got = result_line.parse(done.text, f"{FETCH} fetch")
    except ContractError:
        raise HostError(host.alias, f"`{FETCH} fetch` printed no result line") from None
    if not got.ok:
        return None
    return int(got.data.get("status", 0)), dict(got.data.get("document") or {})


def controller_of(state: tuple[int, dict[str, Any]] | None) -> dict[str, Any]:
    """The `controller` section of a router's /narwhal/state ({} when none answered)."""
    return dict((state or (0, {}))[1].get("controller") or {})


class RouterHost:
    """The router host as Gate G drives it: its folder, its tools, a bounded JSON GET."""

    def __init__(self, host: Host, install: dict[str, Any]) -> None:
        remote = str(install["remote_dir"])
        self.host = host
        self.folder = f"{install_dir(host, remote)}/runs/{install['prepared_run']}/router"
        self.monitoring = f"{self.folder}/monitoring"
        self.serve = installed_tool(host, remote, SERVE)
        self.fetch = installed_tool(host, remote, FETCH)

    def get(self, url: str) -> tuple[int, dict[str, Any]] | None:
        """GET a JSON document from the router host; None when nothing answers."""
        return fetch_json(self.host, self.fetch, url)

    def log_tail(self, path: str) -> str:
        done = self.host.run(cl.read_file(path))
        return done.stdout.decode("utf-8", "replace").strip()[-600:] if done.ok else ""


def _wait(what: str, check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def served_fleet(ledger: Ledger, attempt_id: str) -> str:
    """The fleet document's sha256 an earlier serve attempt started its router on ("" when its
    plan cannot be read)."""
    return str((attempt_plan(ledger, "serve", attempt_id) or {}).get("fleet_sha256", ""))


def _role(state: tuple[int, dict[str, Any]] | None, p: ServePlan) -> str:
    """What answers at an address: "primary" or "standby" (a router of this fleet's model),
    "other" (something else answers), or "" (nothing answers)."""
    if state is None:
        return ""
    status, doc = state
    role = str(controller_of(state).get("role", ""))
    if status == 200 and doc.get("model") == p.fleet["model"] and role in ("primary", "standby"):
        return role
    return "other"


def _pid(state: tuple[int, dict[str, Any]] | None) -> int | None:
    pid = controller_of(state).get("pid")
    return int(pid) if isinstance(pid, int) else None


def _answer(state: tuple[int, dict[str, Any]] | None, p: ServePlan) -> Answer:
    """What answers at an address, as the adoption rule reads it (serve_rules.py)."""
    standby_of = controller_of(state).get("standby_of")
    return Answer(_role(state, p), _pid(state),
                  standby_of if isinstance(standby_of, str) else None)


def serving(rh: RouterHost, p: ServePlan) -> ServePlan:
    """The plan as it serves now: after a takeover the primary answers at the standby's
    address, so the two are swapped (the trial and the tunnel go to the primary)."""
    if p.standby is not None and _role(rh.get(f"{url_of(p.standby)}/narwhal/state"), p) \
            == "primary":
        return replace(p, bind=p.standby, standby=p.bind)
    return p


def start_routers(rh: RouterHost, attempt: Attempt, ledger: Ledger, p: ServePlan,
                  progress: Progress) -> tuple[ServePlan, dict[str, Any]]:
    """This fleet's primary router, and its warm standby when the plan has one; each adopted
    when it already answers as such at a planned address, else started and owned. Every
    other narwhal-serve an earlier attempt started here is ended first (one on an earlier
    fleet document: a router reads its fleet once; one that does not answer; one at an
    address the plan no longer names), so exactly one controller serves. Returns the plan as
    served (the primary's address first) and what was done."""
    ours = [r for r in earlier_processes(ledger, "serve", attempt.id, SERVE)
            if r["host"] == p.router and alive(rh.host, r)]
    older = [r for r in ours if served_fleet(ledger, str(r["attempt"])) != p.fleet_sha256]
    if older:
        progress("router", "the running router serves an earlier fleet document; replacing "
                 "it with one on the fleet Gate F checked")
        retire(rh.host, older, progress, "router")
    seen = {b: rh.get(f"{url_of(b)}/narwhal/state") for b in p.addresses}
    decided = adoption(p.bind, p.standby, {b: _answer(seen[b], p) for b in p.addresses})
    primary, standby_at, standing_by = decided.primary, decided.standby_at, decided.standing_by
    keep: set[int | None] = set(decided.keep)
    ending = set(strays(decided.keep, [int(r["pid"]) for r in ours if r not in older]))
    stray = [r for r in ours if r not in older and int(r["pid"]) in ending]
    if stray:  # ours, but not what the plan keeps: a hung router, a standby no longer named
        retire(rh.host, stray, progress, "router")
        seen = {b: rh.get(f"{url_of(b)}/narwhal/state") for b in p.addresses}
    record_adoptions(attempt, [r for r in ours if r not in older and r not in stray], keep)
    done: dict[str, Any]
    if primary is not None:
        controller = controller_of(seen[primary])
        progress("router", f"adopting the router already serving at {url_of(primary)} "
                 f"(lease epoch {controller.get('epoch')})")
        done = {"router": "adopted", "epoch": controller.get("epoch"),
                "holder_id": controller.get("holder_id")}
    else:
        primary = p.bind
        _free(p, primary, seen[primary])
        done = {"router": "started", "pid": _start_one(rh, attempt, p, primary, None, progress)}
    served = replace(p, bind=primary, standby=standby_at)
    done["router_url"] = served.router_url
    if standby_at is not None:
        if standing_by:
            progress("standby", f"adopting the warm standby at {url_of(standby_at)}")
            done["standby"] = {"url": url_of(standby_at), "action": "adopted"}
        else:
            _free(p, standby_at, rh.get(f"{url_of(standby_at)}/narwhal/state"))
            pid = _start_one(rh, attempt, p, standby_at, primary, progress)
            done["standby"] = {"url": url_of(standby_at), "action": "started", "pid": pid}
    return served, done


def record_adoptions(attempt: Attempt, ours: list[dict[str, Any]],
                     kept: set[int | None]) -> None:
    """Each router an earlier attempt started that this one keeps serving with (by the pid it
    says it has), recorded as adopted: recovering that earlier attempt must not end it."""
    for row in ours:
        if int(row["pid"]) in kept:
            attempt.adopt_process(row, f"serve/{row['attempt']}")


def _free(p: ServePlan, bind: tuple[str, int],
          state: tuple[int, dict[str, Any]] | None) -> None:
    """Blocked, naming what answers, when a planned address is taken by something not ours."""
    if state is None:
        return
    status, doc = state
    raise GateBlocked("serve", f"{url_of(bind)} answers, but not as a router of this fleet "
                      "that narwhal started", [Problem(
                          f"{p.router}: {url_of(bind)}",
                          f"answered {status}: model {doc.get('model')!r}, role "
                          f"{controller_of(state).get('role')!r}",
                          "stop what listens there, or set NARWHAL_ROUTER_URL (or "
                          "NARWHAL_ROUTER_STANDBY_URL) to a free address")])


def _start_one(rh: RouterHost, attempt: Attempt, p: ServePlan, bind: tuple[str, int],
               standby_of: tuple[str, int] | None, progress: Progress) -> int:
    """Start narwhal-serve at `bind` (a warm standby of `standby_of` when given), owned by the
    attempt, and wait until it answers as such; its pid."""
    what = "router" if standby_of is None else "standby"
    url = url_of(bind)
    progress(what, f"starting narwhal-serve on {p.router} at {url}" + (
        f" as the warm standby of {url_of(standby_of)}" if standby_of else ""))
    log = f"{rh.folder}/{what}-{attempt.id}.log"
    argv = [rh.serve, "--fleet", f"{rh.folder}/fleet.json", "--host", bind[0],
            "--port", str(bind[1])]
    argv += ["--standby-of", url_of(standby_of)] if standby_of else []
    ref = attempt.start_process(rh.host, argv, log, serves=what)
    row = {"pid": ref.pid, "start_ticks": ref.start_ticks}

    def ready() -> bool:
        if not alive(rh.host, row):
            raise GateBlocked("serve", f"narwhal-serve ({what}) exited before it was ready", [
                Problem(f"{p.router}: narwhal-serve at {url}", rh.log_tail(log) or "no output",
                        "if another router holds the controller lease, stop it or start this "
                        "one as its standby; else read the log in the attempt")])
        if standby_of is None:
            got = rh.get(f"{url}/ready")
            return got is not None and got[0] == 200
        return _role(rh.get(f"{url}/narwhal/state"), p) == "standby"
    if not _wait(what, ready, READY_S):
        raise GateBlocked("serve", f"narwhal-serve ({what}) did not become ready in "
                          f"{READY_S:.0f} s", [Problem(
                              f"{p.router}: {url}", rh.log_tail(log) or "not ready",
                              "read /narwhal/state on the router host for the engines it "
                              "holds out")])
    return ref.pid


def bound_engines(rh: RouterHost, attempt: Attempt, p: ServePlan,
                  progress: Progress) -> dict[str, Any]:
    """Every engine of the fleet admitted by the router: its saved profile bound to the
    engine's live generation (the runbook's row "Router restart with the same fleet
    document"), read from /narwhal/state (kept as router-state.json); blocked, naming each
    engine the router holds out and why, when one is not admitted within BOUND_S."""
    want = [str(e["id"]) for e in p.fleet.get("engines", [])]
    seen: dict[str, dict[str, Any]] = {}
    doc: dict[str, Any] = {}

    def all_bound() -> bool:
        nonlocal doc
        got = rh.get(f"{p.router_url}/narwhal/state")
        if got is None or got[0] != 200:
            return False
        doc = got[1]
        seen.clear()
        seen.update({str(e.get("id")): e for e in doc.get("engines", [])
                     if isinstance(e, dict)})
        return all(seen.get(e, {}).get("admitted") and seen[e].get("generation")
                   for e in want)
    progress("router", "every engine's saved profile bound to its live generation")
    done = _wait("bound", all_bound, BOUND_S)
    attempt.add_json("router-state.json", doc)
    if not done:
        held = [e for e in want if not seen.get(e, {}).get("admitted")]
        raise GateBlocked("serve", f"the router holds out {', '.join(held)}", [Problem(
            f"{p.router}: {e}", f"{seen.get(e, {}).get('held_reason') or 'not admitted'}: "
            f"{seen.get(e, {}).get('held_detail') or seen.get(e, {}).get('ejected_reason')}",
            "a new generation needs its profile (`narwhal preflight`); an attestation hold, "
            "`narwhal attest`") for e in held])
    return {e: {"generation": seen[e]["generation"], "role": seen[e].get("role")}
            for e in want}


def _promtool(rh: RouterHost, *args: str) -> None:
    done = rh.host.run(cl.in_dir(rh.monitoring, [PROMTOOL, *args]), timeout=120)
    if not done.ok:
        raise GateBlocked("serve", f"promtool {' '.join(args)} failed", [Problem(
            f"{rh.host.alias}: {' '.join(args[:2])}",
            (done.stdout + done.stderr).decode("utf-8", "replace").strip()[-400:],
            "the generated monitoring does not hold: report it with the attempt")])


def start_monitoring(rh: RouterHost, attempt: Attempt, ledger: Ledger, p: ServePlan,
                     progress: Progress) -> dict[str, Any]:
    slo = p.fleet["slo"]
    files = {
        "prometheus.json": monitoring.prometheus_config(p.targets(), "rules.json"),
        "rules.json": monitoring.alert_rules(float(slo["ttft_s"])),
        "rules-test.json": monitoring.rules_tests("rules.json"),
        "grafana-datasource.json": monitoring.grafana_datasource(p.prometheus_url),
        "grafana-dashboards.json": monitoring.grafana_dashboards_provider(
            f"{rh.monitoring}/dashboards"),
        "dashboards/narwhal-fleet.json": monitoring.grafana_dashboard(float(slo["ttft_s"]),
                                                                       float(slo["tpot_s"])),
        "grafana-server.ini": monitoring.grafana_server_ini(p.grafana_bind),
    }
    rh.host.run(cl.private_dir(f"{rh.monitoring}/dashboards"), check=True)
    for name, text in files.items():
        rh.host.put(text.encode(), f"{rh.monitoring}/{name}", exclusive=False)
        attempt.add_artifact("monitoring-" + name.replace("/", "-"), text.encode())
    problems = monitoring.dashboard_problems(json.loads(files["dashboards/narwhal-fleet.json"]))
    if problems:
        raise GateBlocked("serve", "the dashboard does not hold to Grafana's model",
                          [Problem("dashboard", x, "report it") for x in problems])
    progress("monitoring", "promtool: the configuration, the rules and the rules' tests")
    _promtool(rh, "check", "config", "prometheus.json")
    _promtool(rh, "test", "rules", "rules-test.json")
    for row in earlier_processes(ledger, "serve", attempt.id, PROMETHEUS):
        if row["host"] == p.router:
            retire(rh.host, [row], progress, "prometheus")
    progress("monitoring", f"starting Prometheus at {p.prometheus_url}")
    ref = attempt.start_process(rh.host, [
        PROMETHEUS, f"--config.file={rh.monitoring}/prometheus.json",
        f"--storage.tsdb.path={rh.monitoring}/tsdb-{attempt.id}",
        f"--web.listen-address={p.prometheus_listen}"],
        f"{rh.monitoring}/prometheus-{attempt.id}.log", serves="prometheus")
    want = {(t.job, t.address) for t in p.targets()}
    seen: dict[tuple[str, str], str] = {}

    def all_up() -> bool:
        if not alive(rh.host, {"pid": ref.pid, "start_ticks": ref.start_ticks}):
            raise GateBlocked("serve", "Prometheus exited", [Problem(
                f"{p.router}: prometheus", rh.log_tail(f"{rh.monitoring}/prometheus-"
                                                       f"{attempt.id}.log"),
                f"is {p.prometheus_listen} free on the router host? (it is "
                "NARWHAL_PROMETHEUS_LISTEN_ADDRESS)")])
        got = rh.get(f"{p.prometheus_url}/api/v1/query?query=up")
        if got is None or got[0] != 200:
            return False
        seen.clear()
        for r in got[1].get("data", {}).get("result", []):
            seen[(r["metric"].get("job", ""), r["metric"].get("instance", ""))] = r["value"][1]
        return all(seen.get(k) == "1" for k in want)
    if not _wait("up", all_up, UP_S):
        down = sorted(f"{job} {address}" for job, address in want
                      if seen.get((job, address)) != "1")
        raise GateBlocked("serve", f"Prometheus does not see every target up: {down[:3]}", [
            Problem(f"prometheus: {d}", "up is not 1", "is it listening where the fleet says, "
                    "reachable from the router host?") for d in down])
    return {"prometheus_pid": ref.pid, "up": {f"{j} {a}": v for (j, a), v in sorted(seen.items())}}


def panel_series(rh: RouterHost, p: ServePlan) -> dict[str, int]:
    """How many series each dashboard panel's query returns from the live Prometheus."""
    slo = p.fleet["slo"]
    out = {}
    for title, expr in monitoring.panels(float(slo["ttft_s"]), float(slo["tpot_s"])):
        got = rh.get(f"{p.prometheus_url}/api/v1/query?"
                     + urllib.parse.urlencode({"query": expr}))
        out[title] = len(got[1].get("data", {}).get("result", [])) if got and got[0] == 200 else 0
    return out


def through_router(router_port: int, p: ServePlan, api_key: str | None,
                   ready_s: float = TUNNEL_READY_S) -> dict[str, Any]:
    """The private path to the router, from the workstation's end of the SSH forward: /ready
    until it says 200 (at most `ready_s`), then one completion with its own x-request-id."""
    base = f"http://127.0.0.1:{router_port}"
    answers: list[int] = []

    def ready_now() -> bool:
        answers.append(http(f"{base}/ready", timeout_s=5.0)[0])
        return answers[-1] == 200

    _wait("the router's /ready through the forward", ready_now, ready_s)
    ready = answers[-1] if answers else 0
    request_id = f"narwhal-serve-check-{os.urandom(6).hex()}"
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    status, body = http(f"{base}/v1/completions", {
        "model": p.fleet["model"], "prompt": "the sea", "max_tokens": 4},
        {"x-request-id": request_id, **auth})
    return {"ready": ready, "ready_polls": len(answers), "completion": status,
            "request_id": request_id, "completion_bytes": len(body)}


def prometheus_up_series(prometheus_port: int) -> int:
    """How many `up` series Prometheus answers with through the forward (0: no answer)."""
    up = http(f"http://127.0.0.1:{prometheus_port}/api/v1/query?query=up")
    return len(json.loads(up[1]).get("data", {}).get("result", [])) if up[0] == 200 else 0


def execute(inputs: Inputs, ledger: Ledger, host: Host, attempt: Attempt, p: ServePlan,
            progress: Progress) -> dict[str, Any]:
    rh = RouterHost(host, p.install)
    placed = host.stat_file(f"{rh.folder}/fleet.json")
    if placed is None or placed[1] != p.fleet_sha256:
        raise GateBlocked("serve", "the fleet on the router host is not the one Gate F checked",
                          [Problem(f"{p.router}: {rh.folder}/fleet.json",
                                   "missing" if placed is None else "changed since preflight",
                                   "run `narwhal preflight` again")])
    p, router = start_routers(rh, attempt, ledger, p, progress)  # p: the primary first
    bound = bound_engines(rh, attempt, p, progress)
    api_key = inputs.router.api_key.reveal() if inputs.router.api_key else None
    with forwarded(host, [p.bind, p.prometheus_at]) as (router_port, prometheus_port):
        # The completion goes first, before Prometheus starts: its series are then in the
        # first scrape, and the dashboard's panels have data as soon as every target is up.
        progress("private path", "through the SSH forward: /ready and one completion")
        tunnel = through_router(router_port, p, api_key)
        if tunnel["ready"] != 200 or tunnel["completion"] != 200:
            raise GateBlocked("serve", "the router does not serve through the private path", [
                Problem(f"tunnel -> {p.router_url}", f"/ready {tunnel['ready']}, completion "
                        f"{tunnel['completion']}", "read router-state.json in the attempt")])
        mon = start_monitoring(rh, attempt, ledger, p, progress)
        progress("private path", "through the SSH forward: Prometheus")
        tunnel["prometheus_up_series"] = prometheus_up_series(prometheus_port)
    series: dict[str, int] = {}

    def panels_have_data() -> bool:
        series.clear()
        series.update(panel_series(rh, p))
        return all(n > 0 for n in series.values())
    # the completion's series came with the first scrape; poll until every panel has data,
    # for at most two scrape intervals
    _wait("panels", panels_have_data, 2 * monitoring.SCRAPE_INTERVAL_S + 1)
    attempt.add_json("panel-series.json", series)
    empty = [t for t, n in series.items() if n == 0]
    if empty:
        raise GateBlocked("serve", f"dashboard panels without data: {', '.join(empty[:3])}", [
            Problem(f"panel {t}", "its query returns no series", "check the scrape targets")
            for t in empty])
    return {"router_host": p.router, **router, "engines": bound,
            **mon,
            "tunnel": tunnel, "panels": series, "grafana": "SKIP: not started on this host "
            "(its provisioning and every panel's query were checked)"}
