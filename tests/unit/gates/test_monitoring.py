"""The router host's monitoring as generated: promtool accepts the configuration and the rules
and passes the rules' own tests; the Grafana dashboard holds to the documented model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from narwhal.deploy.gates import monitoring

FLEET: dict[str, Any] = {"engines": [
    {"id": f"engine-{n}", "url": f"http://10.0.0.{n}:8001",
     "attestation_url": f"http://10.0.0.{n}:8010/v1/attestation"} for n in (1, 2, 3)]}
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is absent (scripts/apt-packages.txt has it)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_every_engine_and_sidecar_and_the_router_is_scraped() -> None:
    found = {(t.job, t.address, t.engine) for t in monitoring.targets(FLEET, "127.0.0.1:8000")}
    assert ("narwhal-router", "127.0.0.1:8000", "") in found
    assert {(t[0], t[2]) for t in found if t[0] != "narwhal-router"} == {
        (job, f"engine-{n}") for job in ("engines", "sidecars") for n in (1, 2, 3)}
    assert ("sidecars", "10.0.0.2:8010", "engine-2") in found


@needs_promtool
def test_promtool_accepts_the_config_and_rules_and_passes_the_rules_tests(
        tmp_path: Path) -> None:
    (tmp_path / "rules.json").write_text(monitoring.alert_rules(2.0))
    (tmp_path / "prometheus.json").write_text(monitoring.prometheus_config(
        monitoring.targets(FLEET, "127.0.0.1:8000"), "rules.json"))
    (tmp_path / "rules-test.json").write_text(monitoring.rules_tests("rules.json"))
    for args in (("check", "config", "prometheus.json"), ("check", "rules", "rules.json"),
                 ("test", "rules", "rules-test.json")):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60,
                              check=False, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stdout, done.stderr)


@needs_promtool
def test_the_rules_tests_fail_when_an_alert_would_not_fire(tmp_path: Path) -> None:
    """The tests can fail: an engine-down rule that never fires is caught by them."""
    rules = json.loads(monitoring.alert_rules(2.0))
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "NarwhalEngineDown":
            rule["expr"] = 'up{job="engines"} == 2'
    (tmp_path / "rules.json").write_text(json.dumps(rules))
    (tmp_path / "rules-test.json").write_text(monitoring.rules_tests("rules.json"))
    done = subprocess.run(["promtool", "test", "rules", "rules-test.json"], capture_output=True,
                          text=True, timeout=60, check=False, cwd=tmp_path)
    assert done.returncode != 0 and "NarwhalEngineDown" in done.stdout + done.stderr


def test_the_dashboard_holds_to_grafanas_model_and_each_panel_is_a_generated_query() -> None:
    dashboard = json.loads(monitoring.grafana_dashboard(2.0, 0.125))
    assert monitoring.dashboard_problems(dashboard) == []
    assert [p["targets"][0]["expr"] for p in dashboard["panels"]] == [
        q for _, q in monitoring.panels(2.0, 0.125)]
    broken = {**dashboard, "panels": [{**dashboard["panels"][0], "targets": []},
                                      {**dashboard["panels"][0]}]}
    problems = monitoring.dashboard_problems(broken)
    assert "panel ids repeat" in problems and any("has no query" in p for p in problems)
    datasource = json.loads(monitoring.grafana_datasource("http://127.0.0.1:9090"))
    assert datasource["datasources"][0]["uid"] == dashboard["panels"][0]["datasource"]["uid"]


def test_the_attainment_alert_fires_exactly_where_the_trial_calls_a_capacity_miss() -> None:
    """One target: a rate the trial calls within SLO must not page the operator in production."""
    from narwhal.core.attainment import TARGET_ATTAINMENT
    from narwhal.deploy.trial.verdict import verdict

    rules = json.loads(monitoring.alert_rules(2.0))["groups"][0]["rules"]
    low = next(r for r in rules if r["alert"] == "NarwhalTtftAttainmentLow")
    assert low["expr"].endswith(f") < {TARGET_ATTAINMENT}")
    at = {"requests": 10, "late_sends": 0, "statuses": {"200": 10}}
    assert verdict({**at, "attainment": TARGET_ATTAINMENT}, True, True) == "within SLO"
    assert verdict({**at, "attainment": TARGET_ATTAINMENT - 0.01}, True, True) == "capacity miss"
