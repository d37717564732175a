"""Three kv_both emulators under role flips: load shifts move an engine between pools, no restart.

Emulator timing (and the profile rows, which carry the same costs): a prefill costs 0.01 s +
0.22 ms per prompt token (character), a decode step 5 ms + 8 ms per running stream. TTFT budget
1.0 s, TPOT budget 0.05 s, marks 0.6 / 0.3. The split starts as one prefill engine, two decode.
- prefill-heavy burst: 1600-token prompts with max_tokens 1 keep about two prefills (0.37 s
  each) queued on the lone prefill engine, a prefill load near 0.75, while decode idles: a
  decode engine flips to prefill.
- decode-heavy phase: short prompts with 60 tokens each, five streams on the lone decode
  engine make a step of ~45 ms (load ~0.9) while prefill idles: a prefill engine flips back.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port, start_engine, write_tiny_llama
from tests.component.serve.harness import Router, call
from tests.component.serve.test_generation_binding import live_generation, wait_for, write_profiles
from tests.component.serve.test_with_emulator import ENGINE_ARGS

pytestmark = pytest.mark.timeout(120)
NAMES = ("b0", "b1", "b2")
# The tiny tokenizer spends a token per character; the router learns that ratio from the first
# replies (token_estimate.py), so the profile carries the emulator's own per-token cost.
A_S, B_S = 0.01, 2.2e-4
BASE_S, PER_REQUEST_S = 0.005, 0.008
LONG = {"model": "tiny", "prompt": "sea " * 400, "max_tokens": 1}
SHORT = {"model": "tiny", "prompt": "the sea", "max_tokens": 60}


def profile_row(engine_id: str, port: int) -> dict[str, Any]:
    return {"engine_id": engine_id, "generation": live_generation(port).model_dump(),
            "prefill": {"a_s": A_S, "b_s_per_token": B_S, "c_s_per_token2": 0.0,
                        "fit_error": 0.01, "loo_error": 0.01, "samples": 12,
                        "max_prompt_tokens": 4096},
            "decode": {"base_s": BASE_S, "per_token_s": 0.0, "per_request_s": PER_REQUEST_S,
                       "fit_error": 0.01, "loo_error": 0.01, "samples": 24, "max_requests": 64,
                       "max_resident_tokens": 65536},
            "measured_at": "2026-11-30T12:00:00+00:00"}


REACTIVE = {"interval_s": 0.2, "high_water": 0.6, "low_water": 0.3, "cooldown_s": 1.0,
            "min_prefill": 1, "min_decode": 1}
PLANNER = {"mode": "planner", "interval_s": 0.2, "window_s": 1.0, "cooldown_s": 1.0,
           "min_prefill": 1, "min_decode": 1}


@contextmanager
def emulator_fleet(tmp_path: Path, names: tuple[str, ...],
                   flips: dict[str, Any]) -> Iterator[Router]:
    """`both` emulators with the timing above, their profile rows and a router over them
    with `flips`; everything stopped on the way out."""
    model = write_tiny_llama(tmp_path / "tiny")
    engines: list[RunningEngine] = []
    router: Router | None = None
    args = [a for a in ENGINE_ARGS if a != "--emu-zero-delay"]
    try:
        for name in names:
            engines.append(start_engine(
                model, log_path=tmp_path / f"{name}.log",
                extra_args=[*args, "--emu-prefill-a", str(A_S), "--emu-prefill-b", str(B_S),
                            "--emu-prefill-c", "0", "--emu-decode-base", str(BASE_S),
                            "--emu-decode-per-token", "0", "--emu-decode-per-request",
                            str(PER_REQUEST_S), "--emu-eos-probability", "0"],
                env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}))
        write_profiles(tmp_path / "profiles.json",
                       [profile_row(n, e.port) for n, e in zip(names, engines, strict=True)])
        (tmp_path / "fleet.json").write_text(json.dumps({
            "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
            "engines": [{"id": n, "url": e.url, "role": "both"}
                        for n, e in zip(names, engines, strict=True)],
            "slo": {"ttft_s": 1.0, "tpot_s": 0.05}, "journal": {"path": "journal.jsonl"},
            "profiles": {"path": "profiles.json"},
            "role_flips": flips}))
        router = Router(tmp_path / "fleet.json", free_port()).start()
        yield router
    finally:
        if router is not None and router.proc is not None and router.proc.poll() is None:
            router.stop()
        for engine in engines:
            engine.stop()


@pytest.fixture
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Router]:
    with emulator_fleet(tmp_path, NAMES, getattr(request, "param", REACTIVE)) as router:
        yield router


def roles(router: Router) -> dict[str, str]:
    state = call(router.port, "GET", "/narwhal/state").json()
    return {e["id"]: e["current_role"] for e in state["engines"]}


def drive(router: Router, body: dict[str, Any], clients: int, until: Callable[[], bool],
          limit_s: float) -> tuple[list[int], float]:
    """Keep `clients` requests going until `until()` holds (polled) or `limit_s` passes."""
    statuses: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def client() -> None:
        for _ in range(200):
            if stop.is_set():
                return
            reply = call(router.port, "POST", "/v1/completions", body, timeout=30)
            status = reply.status
            statuses.append(status)
            if status not in (200, 429):
                errors.append(reply.body[:300].decode(errors="replace"))
            if status == 429:
                time.sleep(0.05)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    try:
        while not until() and time.monotonic() - t0 < limit_s:
            time.sleep(0.1)
        took = time.monotonic() - t0
    finally:
        stop.set()
        for t in threads:
            t.join(40)
    assert not errors, errors[:3]
    return statuses, took


def test_a_prefill_burst_flips_a_decode_engine_and_a_decode_phase_flips_one_back(
        fleet: Router) -> None:
    router = fleet
    wait_for("every engine bound to its profile", lambda: all(
        e["admitted"] for e in call(router.port, "GET", "/narwhal/state").json()["engines"]))
    assert sorted(roles(router).values()) == ["decode", "decode", "prefill"]
    pids_before = call(router.port, "GET", "/narwhal/state").json()["engines"]

    def count(role: str) -> Callable[[], bool]:
        return lambda: sorted(roles(router).values()).count(role) == 2

    statuses, took = drive(router, LONG, clients=4, until=count("prefill"), limit_s=8.0)
    assert sorted(roles(router).values()) == ["decode", "prefill", "prefill"], (took, statuses)
    assert took < 8.0 and 200 in statuses and set(statuses) <= {200, 429}
    state = call(router.port, "GET", "/narwhal/state").json()
    flipped = [e for e in state["engines"] if e["last_flip"] is not None]
    assert len(flipped) == 1 and flipped[0]["last_flip"]["to"] == "prefill"
    assert "prefill above high water" in flipped[0]["last_flip"]["why"]

    statuses, took = drive(router, SHORT, clients=5, until=count("decode"), limit_s=8.0)
    assert sorted(roles(router).values()) == ["decode", "decode", "prefill"], (took, statuses)
    assert took < 8.0 and statuses.count(200) == len(statuses)

    state = call(router.port, "GET", "/narwhal/state").json()
    back = [e["last_flip"] for e in state["engines"]
            if e["last_flip"] is not None and e["last_flip"]["to"] == "decode"]
    assert len(back) == 1 and "decode above high water" in back[0]["why"]
    assert back[0]["decode_load"] > 0.6 > 0.3 > back[0]["prefill_load"]
    assert state["role_flips"]["flips"] == [{"from": "decode", "to": "prefill", "count": 1},
                                            {"from": "prefill", "to": "decode", "count": 1}]
    assert [e["generation"] for e in state["engines"]] == \
        [e["generation"] for e in pids_before]  # same engine processes: no restart
    metrics = call(router.port, "GET", "/metrics").body.decode()
    assert 'narwhal_router_role_flips_total{from="decode",to="prefill"} 1.0' in metrics
    assert 'narwhal_router_role_flips_total{from="prefill",to="decode"} 1.0' in metrics


@pytest.mark.parametrize("fleet", [PLANNER], indirect=True)
def test_the_planner_sizes_the_pools_from_the_demand_window(fleet: Router) -> None:
    router = fleet
    wait_for("every engine bound to its profile", lambda: all(
        e["held_reason"] is None for e in call(router.port, "GET", "/narwhal/state").json()["engines"]))

    def count(role: str) -> Callable[[], bool]:
        return lambda: sorted(roles(router).values()).count(role) == 2

    # Four clients of 1600-token prompts offer ~1 s of prefill a second: two prefill engines.
    statuses, took = drive(router, LONG, clients=4, until=count("prefill"), limit_s=10.0)
    state = call(router.port, "GET", "/narwhal/state").json()
    assert sorted(roles(router).values()) == ["decode", "prefill", "prefill"], (took, statuses)
    assert state["role_flips"]["target_prefill"] == 2
    assert state["role_flips"]["demand"]["prefill_s_per_s"] > 0.5
    assert sorted(state["pools"]["prefill"]) == sorted(
        e["id"] for e in state["engines"] if e["current_role"] == "prefill")
    assert state["prompt_estimate"]["bytes_per_token"]["completions"] < 1.5  # a token a character
    why = [e["last_flip"]["why"] for e in state["engines"] if e["last_flip"] is not None]
    assert len(why) == 1 and why[0].startswith("planner: 2 of 3 engines should prefill")

    # Five streams of 60 tokens and almost no prefill: the window moves an engine back.
    statuses, took = drive(router, SHORT, clients=5, until=count("decode"), limit_s=10.0)
    assert sorted(roles(router).values()) == ["decode", "decode", "prefill"], (took, statuses)
    assert statuses.count(200) == len(statuses)
    state = call(router.port, "GET", "/narwhal/state").json()
    assert state["role_flips"]["target_prefill"] == 1
    metrics = call(router.port, "GET", "/metrics").body.decode()
    assert 'narwhal_router_pool_engines{pool="decode"} 2.0' in metrics
    assert 'narwhal_router_pool_engines{pool="prefill"} 1.0' in metrics
    assert "narwhal_router_planner_target_prefill_engines 1.0" in metrics
    assert 'narwhal_router_pool_load{pool="decode"}' in metrics
