"""A restarted engine is held out of placement (`reprofile`) until its profile row is rewritten.

One vLLM-faithful emulator (role both) behind a router with a profile store. Restarting the
emulator gives it a new process start time, so a new generation; the router must notice on
its sweep, refuse to place on it, say why in /narwhal/state and /metrics, and take it back as
soon as the store carries the new generation (file change, no restart; or SIGHUP).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.profiles import Generation
from narwhal.lab.engine.testing import RunningEngine, free_port, start_engine, write_tiny_llama
from narwhal.serve.router.scheduling.generation import parse_start_time, parse_version
from tests.component.serve.harness import Router, call
from tests.component.serve.test_with_emulator import ENGINE_ARGS

pytestmark = pytest.mark.timeout(120)
BODY = {"model": "tiny", "prompt": "the sea and the ships", "max_tokens": 3}


def live_generation(port: int) -> Generation:
    version = call(port, "GET", "/version").body
    metrics = call(port, "GET", "/metrics").body
    return Generation(engine_version=parse_version(version),
                      process_start_time_seconds=parse_start_time(metrics))


def profile_row(engine_id: str, generation: Generation) -> dict[str, Any]:
    return {"engine_id": engine_id, "generation": generation.model_dump(),
            "prefill": {"a_s": 0.002, "b_s_per_token": 1e-5, "c_s_per_token2": 1e-9,
                        "fit_error": 0.02, "loo_error": 0.03, "samples": 12,
                        "max_prompt_tokens": 4096},
            "decode": {"base_s": 0.004, "per_token_s": 2e-8, "per_request_s": 1e-4,
                       "fit_error": 0.03, "loo_error": 0.04, "samples": 24, "max_requests": 64,
                       "max_resident_tokens": 65536},
            "measured_at": "2026-11-30T12:00:00+00:00"}


def write_profiles(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"schema": "narwhal.profiles", "schema_version": 1,
                               "model": "tiny", "profiles": rows}))
    os.replace(tmp, path)


def wait_for(what: str, check: Callable[[], bool], timeout: float = 6.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def engine_state(router: Router) -> dict[str, Any]:
    state: dict[str, Any] = call(router.port, "GET", "/narwhal/state").json()
    return dict(state["engines"][0])


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[tuple[Path, Path, Router, list[RunningEngine]]]:
    model = write_tiny_llama(tmp_path / "tiny")
    engines: list[RunningEngine] = []
    router: Router | None = None
    try:
        engines.append(start_engine(model, log_path=tmp_path / "e0.log", extra_args=ENGINE_ARGS,
                                    env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}))
        profiles = tmp_path / "profiles.json"
        write_profiles(profiles, [profile_row("e0", live_generation(engines[0].port))])
        fleet = tmp_path / "fleet.json"
        fleet.write_text(json.dumps({
            "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
            "engines": [{"id": "e0", "url": engines[0].url, "role": "both"}],
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "journal.jsonl"},
            "health": {"probe_interval_s": 0.3}, "profiles": {"path": "profiles.json"}}))
        router = Router(fleet, free_port()).start()
        yield model, profiles, router, engines
    finally:
        if router is not None and router.proc is not None and router.proc.poll() is None:
            router.stop()
        for engine in engines:
            engine.stop()


def test_a_restarted_engine_is_held_for_reprofile_until_its_row_matches_again(
        bound: tuple[Path, Path, Router, list[RunningEngine]]) -> None:
    model, profiles, router, engines = bound
    assert call(router.port, "POST", "/v1/completions", BODY).status == 200
    first = engine_state(router)
    assert first["admitted"] and first["held_reason"] is None

    port = engines[0].port
    engines[0].stop()
    engines.append(start_engine(model, log_path=profiles.with_name("e0-again.log"), port=port,
                                extra_args=ENGINE_ARGS,
                                env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}))
    wait_for("held for reprofile", lambda: engine_state(router)["held_reason"] == "reprofile")
    state = engine_state(router)
    assert not state["admitted"] and "narwhal-profile --only e0" in state["held_detail"]
    assert state["generation"]["process_start_time_seconds"] != \
        first["generation"]["process_start_time_seconds"]
    reply = call(router.port, "POST", "/v1/completions", BODY)
    assert reply.status == 503 and reply.json()["error"]["code"] == "no_engine"
    ready = call(router.port, "GET", "/ready")
    assert ready.status == 503
    metrics = call(router.port, "GET", "/metrics").body.decode()
    assert 'narwhal_router_engine_held{engine="e0",reason="reprofile"} 1.0' in metrics
    assert 'narwhal_router_engine_admitted{engine="e0",role="both"} 0.0' in metrics
    pools = call(router.port, "GET", "/narwhal/state").json()["pools"]
    assert pools["held"] == ["e0"] and pools["prefill"] == pools["decode"] == []
    assert 'narwhal_router_pool_engines{pool="held"} 1.0' in metrics
    assert 'narwhal_router_pool_engines{pool="decode"} 0.0' in metrics

    write_profiles(profiles, [profile_row("e0", live_generation(port))])  # re-profiled
    wait_for("bound again", lambda: engine_state(router)["admitted"])
    assert engine_state(router)["held_reason"] is None
    assert call(router.port, "POST", "/v1/completions", BODY).status == 200


def test_sighup_rereads_the_store_and_a_broken_store_keeps_the_last_good_one(
        bound: tuple[Path, Path, Router, list[RunningEngine]]) -> None:
    _, profiles, router, engines = bound
    assert router.proc is not None
    profiles.write_text("{broken")
    os.kill(router.proc.pid, signal.SIGHUP)
    wait_for("reload error shown", lambda: call(router.port, "GET", "/narwhal/state").json()
             ["profiles"]["last_error"] is not None)
    assert engine_state(router)["admitted"]  # the last good store still binds e0
    stale = live_generation(engines[0].port).model_copy(update={"engine_version": "0.31.0"})
    write_profiles(profiles, [profile_row("e0", stale)])
    os.kill(router.proc.pid, signal.SIGHUP)
    wait_for("held for reprofile", lambda: engine_state(router)["held_reason"] == "reprofile",
             timeout=2.0)
