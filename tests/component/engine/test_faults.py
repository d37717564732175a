"""Faults on command: each one shows up to a client the way a broken vLLM engine would."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from narwhal.lab.engine.testing import healthy
from tests.component.engine.client import get, post
from tests.component.engine.conftest import StartEngine

pytestmark = pytest.mark.timeout(120)
SLOW_ARGS = ("--emu-decode-base", "0.02", "--emu-decode-per-token", "0",
             "--emu-decode-per-request", "0", "--emu-prefill-a", "0")


def _wait(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_crash_ends_the_process_like_a_dead_engine(engines: StartEngine) -> None:
    engine = engines()
    reply = post(engine, "/emu/fault", {"fault": "crash", "exit_code": 3})
    assert reply.status == 200 and reply.json()["crashing"] is True
    assert _wait(lambda: not engine.alive())
    assert engine.process.returncode == 3
    assert not healthy(engine.port)
    assert "EngineCore encountered a fatal error" in engine.log_text()


def test_hang_stops_every_answer_until_cleared(engines: StartEngine) -> None:
    engine = engines(*SLOW_ARGS)
    assert post(engine, "/emu/fault", {"fault": "hang"}).json()["faults"]["hung"] is True
    assert not healthy(engine.port, timeout=0.5)
    with pytest.raises(socket.timeout):
        post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=0.5)
    assert get(engine, "/emu/state").json()["faults"]["hung"] is True
    post(engine, "/emu/fault", {"fault": "clear"})
    assert healthy(engine.port)
    assert post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status == 200


def test_a_request_in_flight_stalls_during_a_hang_and_then_completes(
        engines: StartEngine) -> None:
    engine = engines(*SLOW_ARGS)
    result: dict[str, int] = {}

    def send() -> None:
        reply = post(engine, "/v1/completions", {"prompt": "x", "max_tokens": 30,
                                                 "ignore_eos": True})
        result["status"] = reply.status

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.1)
    post(engine, "/emu/fault", {"fault": "hang"})
    time.sleep(1.0)
    assert "status" not in result  # 30 tokens x 20 ms would have finished by now
    post(engine, "/emu/fault", {"fault": "hang", "enabled": False})
    sender.join(30)
    assert result["status"] == 200


def test_sigusr1_toggles_the_hang(engines: StartEngine) -> None:
    engine = engines()
    os.kill(engine.pid, signal.SIGUSR1)
    assert _wait(lambda: get(engine, "/emu/state").json()["faults"]["hung"])
    assert not healthy(engine.port, timeout=0.5)
    os.kill(engine.pid, signal.SIGUSR1)
    assert _wait(lambda: healthy(engine.port))


def test_slow_multiplies_generation_time(engines: StartEngine) -> None:
    engine = engines(*SLOW_ARGS)
    body = {"prompt": "x", "max_tokens": 10, "ignore_eos": True}

    def timed() -> float:
        began = time.monotonic()
        assert post(engine, "/v1/completions", body).status == 200
        return time.monotonic() - began

    normal = timed()
    post(engine, "/emu/fault", {"fault": "slow", "factor": 5})
    slowed = timed()
    assert slowed > 3 * normal
    post(engine, "/emu/fault", {"fault": "clear"})
    assert timed() < slowed / 2


def test_wrong_model_serves_another_name(engines: StartEngine) -> None:
    engine = engines("--served-model-name", "good")
    post(engine, "/emu/fault", {"fault": "wrong_model", "model": "other"})
    assert [m["id"] for m in get(engine, "/v1/models").json()["data"]] == ["other"]
    refused = post(engine, "/v1/completions", {"model": "good", "prompt": "x"})
    assert refused.status == 404
    assert refused.json()["error"]["message"] == ("The model `good` does not exist. Valid "
                                                  "aliases: other.")
    assert post(engine, "/v1/completions", {"model": "other", "prompt": "x",
                                            "max_tokens": 1}).json()["model"] == "other"
    post(engine, "/emu/fault", {"fault": "clear"})
    assert [m["id"] for m in get(engine, "/v1/models").json()["data"]] == ["good"]


def test_nixl_fault_flags_are_set_and_cleared(engines: StartEngine) -> None:
    engine = engines()
    for flag in ("refuse_handshakes", "drop_lease_early", "recompute_instead_of_pull",
                 "stale_peer"):
        assert post(engine, "/emu/fault", {"fault": flag}).json()["faults"][flag] is True
    faults = post(engine, "/emu/fault", {"fault": "clear"}).json()["faults"]
    assert faults == {"refuse_handshakes": False, "drop_lease_early": False,
                      "recompute_instead_of_pull": False, "stale_peer": False, "hung": False,
                      "slow_factor": 1.0, "wrong_model": None, "corrupt_pulls_from": None,
                      "cut_pulls_from": None}


def test_corrupt_pulls_names_its_producer_or_every_one_and_clears(engines: StartEngine) -> None:
    engine = engines()
    said = post(engine, "/emu/fault", {"fault": "corrupt_pulls", "peer": "10.0.0.5:5600"})
    assert said.json()["faults"]["corrupt_pulls_from"] == "10.0.0.5:5600"
    assert post(engine, "/emu/fault", {"fault": "corrupt_pulls"}).json()["faults"][
        "corrupt_pulls_from"] == "*"
    off = post(engine, "/emu/fault", {"fault": "corrupt_pulls", "enabled": False}).json()
    assert off["faults"]["corrupt_pulls_from"] is None
    bad = post(engine, "/emu/fault", {"fault": "corrupt_pulls", "peer": ""})
    assert bad.status == 400


def test_cut_pulls_names_its_producer_or_every_one_and_clear_mends_it(
        engines: StartEngine) -> None:
    engine = engines()
    said = post(engine, "/emu/fault", {"fault": "cut_pulls", "peer": "engine-1"})
    assert said.json()["faults"]["cut_pulls_from"] == "engine-1"
    assert post(engine, "/emu/fault", {"fault": "cut_pulls"}).json()["faults"][
        "cut_pulls_from"] == "*"
    assert post(engine, "/emu/fault", {"fault": "clear"}).json()["faults"][
        "cut_pulls_from"] is None
    assert post(engine, "/emu/fault", {"fault": "cut_pulls", "peer": "x" * 257}).status == 400


@pytest.mark.parametrize("body", [{"fault": "explode"}, {"fault": "slow", "factor": -1},
                                  {"fault": "hang", "extra": 1}, {}])
def test_a_bad_fault_command_is_400(engines: StartEngine, body: dict[str, object]) -> None:
    engine = engines()
    reply = post(engine, "/emu/fault", body)
    assert reply.status == 400 and reply.json()["error"]["code"] == 400


def test_the_admin_token_guards_the_emu_routes(engines: StartEngine) -> None:
    engine = engines(env={"NARWHAL_EMU_ADMIN_TOKEN": "s3cret"})
    assert get(engine, "/emu/state").status == 401
    assert post(engine, "/emu/fault", {"fault": "crash"}).status == 401
    assert engine.alive()
    ok = get(engine, "/emu/state", headers={"X-Emu-Admin-Token": "s3cret"})
    assert ok.status == 200 and ok.json()["pid"] == engine.pid
