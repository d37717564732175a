"""narwhal-check's events gate over real emulator processes: an engine launched with
--kv-events-config passes (the router's index predicts its hits), and one the fleet says
publishes but was launched without it fails, naming the engine, the flag and the fix."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from narwhal.lab.engine.testing import free_port, start_engine, write_tiny_llama
from tests.component.preflight.check_fleet import ENGINE_ARGS, ENV, CheckFleet, run_check

pytestmark = pytest.mark.timeout(180)


def _events_args(port: int) -> list[str]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{port}", "topic": ""}
    return [*ENGINE_ARGS, "--kv-events-config", json.dumps(config)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CheckFleet, int, int]]:
    """e0 publishes on its port; e1 was launched without --kv-events-config."""
    root = tmp_path_factory.mktemp("events")
    model_dir = write_tiny_llama(root / "tiny")
    started = CheckFleet(root, model_dir, {})
    ports = (free_port(), free_port())
    try:
        started.engines["e0"] = start_engine(model_dir, log_path=root / "e0.log",
                                             extra_args=_events_args(ports[0]), env=ENV)
        started.engines["e1"] = start_engine(model_dir, log_path=root / "e1.log",
                                             extra_args=ENGINE_ARGS, env=ENV)
        yield started, *ports
    finally:
        for e in started.engines.values():
            e.stop()


def _write(fleet: CheckFleet, publishing: dict[str, int]) -> None:
    doc = json.loads(fleet.write_fleet().read_text())
    for e in doc["engines"]:
        if e["id"] in publishing:
            e["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{publishing[e['id']]}", "topic": ""}
    fleet.fleet_path.write_text(json.dumps(doc))


def test_an_engine_that_publishes_passes_with_the_predicted_hit_its_counter_reports(
        fleet: tuple[CheckFleet, int, int]) -> None:
    check, port, _ = fleet
    _write(check, {"e0": port})
    run = run_check(check.fleet_path, "--only", "events")
    assert run.code == 0, (run.failures(), run.stderr[-2000:])
    verdicts = run.verdicts("events")
    assert set(verdicts) == {"e0"}  # e1 is not said to publish: nothing to prove
    values = verdicts["e0"]["values"]
    assert values["predicted"] == values["reported"] == 3 * values["block_size"]


def test_an_engine_launched_without_the_flag_fails_naming_it_and_the_fix(
        fleet: tuple[CheckFleet, int, int]) -> None:
    check, port, silent = fleet
    _write(check, {"e0": port, "e1": silent})
    run = run_check(check.fleet_path, "--only", "events", "--events-timeout", "1.5")
    assert run.code == 1
    verdicts = run.verdicts("events")
    assert verdicts["e0"]["status"] == "pass"
    e1 = verdicts["e1"]
    assert e1["status"] == "fail" and e1["measured"] == "no publisher"
    assert "--kv-events-config" in e1["detail"] and "e1" in e1["detail"]
    assert "NARWHAL_KV_EVENTS_PORT" in e1["detail"]
    assert f"tcp://127.0.0.1:{silent}" in e1["detail"]


def test_the_table_names_the_silent_engine_for_the_operator(
        fleet: tuple[CheckFleet, int, int]) -> None:
    check, _, silent = fleet
    _write(check, {"e1": silent})
    run = run_check(check.fleet_path, "--only", "events", "--events-timeout", "1",
                    json_out=False)
    assert run.code == 1
    assert "events" in run.stdout and "e1" in run.stdout and "--kv-events-config" in run.stdout
