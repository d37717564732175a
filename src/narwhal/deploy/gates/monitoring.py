"""The router host's monitoring, generated from the fleet: Prometheus's configuration, its alert
rules with their own tests, and Grafana's provisioning (datasource and dashboard).

Everything is written as JSON, which Prometheus and promtool read as YAML (JSON is YAML's flow
style), so no YAML writer is involved and every file is exactly what was generated. Scrape jobs:
`narwhal-router` (the router's /metrics), `engines` (each engine's /metrics, label `engine`)
and `sidecars` (each attestation sidecar's /metrics, label `engine`). Alerts: an engine or
sidecar down, an engine held out of placement, a sidecar no longer vouching, TTFT attainment
below target, failed handoffs, a controller lease change. The dashboard's panel queries are the
same strings `narwhal serve` runs against the live Prometheus (each must return series), so a
panel that would stay empty is found without Grafana.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from narwhal.core.attainment import TARGET_ATTAINMENT
from narwhal.core.outcomes import FAILED_ON_ENGINE

SCRAPE_INTERVAL_S = 5
# the share of requests within the TTFT SLO below which an alert fires: the trial's target too
ATTAINMENT_TARGET = TARGET_ATTAINMENT
FAILED_OUTCOMES = "|".join(sorted(FAILED_ON_ENGINE))
DATASOURCE_UID = "narwhal-prometheus"
DASHBOARD_UID = "narwhal-fleet"


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port
    engine: str = ""


def _address(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def targets(fleet: dict[str, Any], *router_addresses: str) -> list[Target]:
    """Every scrape target of the fleet: the router (and its warm standby), each engine and
    each attestation sidecar."""
    out = [Target("narwhal-router", a) for a in router_addresses]
    for e in fleet["engines"]:
        out.append(Target("engines", _address(e["url"]), e["id"]))
        if e.get("attestation_url"):
            out.append(Target("sidecars", _address(e["attestation_url"]), e["id"]))
    return out


def _dump(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def prometheus_config(all_targets: list[Target], rules_file: str) -> str:
    jobs: dict[str, list[dict[str, Any]]] = {}
    for t in all_targets:
        group = {"targets": [t.address], "labels": {"engine": t.engine} if t.engine else {}}
        jobs.setdefault(t.job, []).append(group)
    return _dump({
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                   "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
        "rule_files": [rules_file],
        "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                            "scrape_timeout": f"{SCRAPE_INTERVAL_S - 1}s",
                            "static_configs": groups} for job, groups in jobs.items()],
    })


def _alert(name: str, expr: str, for_s: int, summary: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": f"{for_s}s",
            "labels": {"severity": "page"}, "annotations": {"summary": summary}}


def alert_rules(ttft_s: float) -> str:
    le = repr(float(ttft_s))  # an SLO is always a bucket edge of the router's histogram
    attainment = (f'sum(rate(narwhal_router_ttft_seconds_bucket{{le="{le}"}}[1m])) / '
                  "sum(rate(narwhal_router_ttft_seconds_count[1m]))")
    return _dump({"groups": [{"name": "narwhal", "rules": [
        _alert("NarwhalEngineDown", 'up{job="engines"} == 0', 15,
               "engine {{ $labels.engine }} does not answer its /metrics"),
        _alert("NarwhalSidecarDown", 'up{job="sidecars"} == 0', 15,
               "the attestation sidecar of {{ $labels.engine }} does not answer"),
        _alert("NarwhalEngineHeldOut", "narwhal_router_engine_held == 1", 15,
               "the router holds {{ $labels.engine }} out of placement ({{ $labels.reason }})"),
        _alert("NarwhalAttestationRefused", "narwhal_attestation_vouches == 0", 0,
               "the sidecar of {{ $labels.engine }} no longer vouches for its engine"),
        _alert("NarwhalTtftAttainmentLow", f"({attainment}) < {ATTAINMENT_TARGET}", 60,
               f"fewer than {ATTAINMENT_TARGET:.0%} of requests met the {ttft_s:g} s TTFT SLO"),
        _alert("NarwhalHandoffFailures",
               f'increase(narwhal_router_requests_total{{outcome=~"{FAILED_OUTCOMES}"}}[5m]) > 0', 0,
               "requests failed on an engine or a KV handoff ({{ $labels.outcome }})"),
        _alert("NarwhalLeaseChanged", "changes(narwhal_router_lease_epoch[10m]) > 0", 0,
               "the controller lease changed hands {{ $value }} time(s) in 10 minutes"),
        _alert("NarwhalKvPairHeld", "narwhal_router_kv_pair_held == 1", 0,
               "the KV canary holds {{ $labels.producer }} -> {{ $labels.consumer }} out of "
               "placement: its handoff answered wrong, recomputed or failed"),
    ]}]})


def rules_tests(rules_file: str) -> str:
    """promtool's unit tests of the rules: each alert fires on the series that should fire it,
    and stays quiet on a healthy fleet."""
    def alert(name: str, at: str, labels: dict[str, str], summary: str = "") -> dict[str, Any]:
        return {"eval_time": at, "alertname": name, "exp_alerts": [
            {"exp_labels": {"severity": "page", **labels},
             "exp_annotations": {"summary": summary}}] if labels else []}
    return _dump({"rule_files": [rules_file], "evaluation_interval": "5s", "tests": [{
        "interval": "5s",
        "input_series": [
            {"series": 'up{job="engines",engine="engine-1",instance="e1:8001"}',
             "values": "1 1 1 0 0 0 0 0 0"},
            {"series": 'up{job="engines",engine="engine-2",instance="e2:8001"}',
             "values": "1 1 1 1 1 1 1 1 1"},
            {"series": 'narwhal_router_engine_held{engine="engine-2",reason="attestation",'
                       'instance="r:8000",job="narwhal-router"}',
             "values": "1 1 1 1 1 1 1 1 1"},
            {"series": 'narwhal_router_lease_epoch{instance="r:8000",job="narwhal-router"}',
             "values": "1 1 1 2 2 2 2 2 2"},
            {"series": 'narwhal_router_kv_pair_held{producer="engine-1",consumer="engine-2",'
                       'instance="r:8000",job="narwhal-router"}',
             "values": "0 0 1 1 1 1 1 1 1"},
            {"series": 'narwhal_router_kv_pair_held{producer="engine-2",consumer="engine-1",'
                       'instance="r:8000",job="narwhal-router"}',
             "values": "0 0 0 0 0 0 0 0 0"},
        ],
        "alert_rule_test": [
            alert("NarwhalEngineDown", "10s", {}),
            alert("NarwhalEngineDown", "40s", {"job": "engines", "engine": "engine-1",
                                                "instance": "e1:8001"},
                  "engine engine-1 does not answer its /metrics"),
            alert("NarwhalEngineHeldOut", "30s", {"engine": "engine-2", "reason": "attestation",
                                                   "instance": "r:8000",
                                                   "job": "narwhal-router"},
                  "the router holds engine-2 out of placement (attestation)"),
            alert("NarwhalLeaseChanged", "10s", {}),
            alert("NarwhalLeaseChanged", "20s", {"instance": "r:8000", "job": "narwhal-router"},
                  "the controller lease changed hands 1 time(s) in 10 minutes"),
            alert("NarwhalKvPairHeld", "5s", {}),
            alert("NarwhalKvPairHeld", "15s", {"producer": "engine-1", "consumer": "engine-2",
                                                "instance": "r:8000", "job": "narwhal-router"},
                  "the KV canary holds engine-1 -> engine-2 out of placement: its handoff "
                  "answered wrong, recomputed or failed"),
        ],
    }]})


def panels(ttft_s: float, tpot_s: float) -> list[tuple[str, str]]:
    """(title, PromQL) of every dashboard panel: fleet overview, per-engine load and KV, TTFT
    and TPOT against the SLO, handoffs, admission."""
    return [
        ("Targets up", "up"),
        ("Engines placeable", "narwhal_router_engine_admitted"),
        ("Requests by outcome", "sum by (outcome) (narwhal_router_requests_total)"),
        ("In flight", "narwhal_router_inflight_requests"),
        ("Legs in flight per engine", "narwhal_router_engine_outstanding_legs"),
        ("Engine KV cache usage", "vllm:kv_cache_usage_perc"),
        ("Engine requests running", "vllm:num_requests_running"),
        (f"TTFT p90 (SLO {ttft_s:g} s)",
         "histogram_quantile(0.9, sum by (le) (narwhal_router_ttft_seconds_bucket))"),
        (f"TPOT p90 (SLO {tpot_s:g} s)",
         "histogram_quantile(0.9, sum by (le) (narwhal_router_tpot_seconds_bucket))"),
        ("Handoff time p90",
         "histogram_quantile(0.9, sum by (le) (narwhal_router_handoff_seconds_bucket))"),
        ("Controller lease epoch", "narwhal_router_lease_epoch"),
        ("Sidecars vouching", "narwhal_attestation_vouches"),
    ]


def reached_at(listen: str) -> tuple[str, int]:
    """(host, port) a client on the same host reaches a server listening at `listen`
    (`HOST:PORT`, `:PORT`, `[v6]:PORT`): a wildcard or empty host is reached on loopback."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):  # noqa: S104 - recognising the wildcard, not binding it
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return host, int(port)


def grafana_server_ini(bind: str | None) -> str:
    """Grafana's [server] section: where it listens (NARWHAL_GRAFANA_BIND_ADDRESS; its own
    default, every interface, when unset: said so rather than left out)."""
    address = bind if bind is not None else ""
    return ("# generated by narwhal serve: Grafana's listen address "
            "(NARWHAL_GRAFANA_BIND_ADDRESS)\n[server]\n"
            f"http_addr = {address}\n")


def grafana_datasource(prometheus_url: str) -> str:
    return _dump({"apiVersion": 1, "datasources": [{
        "name": "Prometheus", "uid": DATASOURCE_UID, "type": "prometheus", "access": "proxy",
        "url": prometheus_url, "isDefault": True, "editable": False}]})


def grafana_dashboard(ttft_s: float, tpot_s: float) -> str:
    """Grafana's dashboard model (schemaVersion 39): one time-series panel per query."""
    ds = {"type": "prometheus", "uid": DATASOURCE_UID}
    return _dump({
        "uid": DASHBOARD_UID, "title": "Narwhal fleet", "schemaVersion": 39, "version": 1,
        "editable": False, "time": {"from": "now-30m", "to": "now"}, "refresh": "10s",
        "tags": ["narwhal"], "templating": {"list": []},
        "panels": [{"id": i + 1, "type": "timeseries", "title": title, "datasource": ds,
                    "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                    "targets": [{"refId": "A", "datasource": ds, "expr": expr}]}
                   for i, (title, expr) in enumerate(panels(ttft_s, tpot_s))]})


def grafana_dashboards_provider(folder: str) -> str:
    return _dump({"apiVersion": 1, "providers": [{
        "name": "narwhal", "type": "file", "disableDeletion": True,
        "options": {"path": folder}}]})


def dashboard_problems(dashboard: dict[str, Any]) -> list[str]:
    """Grafana's documented dashboard model, checked offline: what would make a panel fail to
    load or stay empty (no uid, a panel without a target or datasource, repeated ids)."""
    out = [f"dashboard lacks {k}" for k in ("uid", "title", "schemaVersion", "panels")
           if not dashboard.get(k)]
    ids = [p.get("id") for p in dashboard.get("panels", [])]
    if len(set(ids)) != len(ids):
        out.append("panel ids repeat")
    for p in dashboard.get("panels", []):
        where = f"panel {p.get('id')} ({p.get('title')})"
        if p.get("datasource", {}).get("uid") != DATASOURCE_UID:
            out.append(f"{where} does not name the provisioned datasource")
        if not p.get("targets") or not all(t.get("expr") for t in p["targets"]):
            out.append(f"{where} has no query")
        if not {"h", "w", "x", "y"} <= set(p.get("gridPos", {})):
            out.append(f"{where} has no grid position")
    return out
