"""The live KV canary, through narwhal-serve to three kv_both emulators.

The reference is recorded the product's way (narwhal-check --calibrate-first-token writes
kv-canary.json beside the calibration); the router probes each of the six ordered pairs once
per interval. One consumer is then made to decode the KV it pulls from one producer as another
request's (the emulator's corrupt_pulls fault, as vllm#52234: every transfer counter says the
pull succeeded, the answer is wrong with HTTP 200): the canary holds exactly that pair within
two intervals, the engines and every other pair keep serving, and no client request is split
over that pair afterwards. A consumer that recomputes instead of pulling is held too (its
counters show it), and a pair is released after passing again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from narwhal.core.kv_canary import load_canary
from tests.component.preflight.check_fleet import CheckFleet, check_fleet, fault, run_check
from tests.component.serve.harness import Router, call, free_port, journal_rows

pytestmark = pytest.mark.timeout(240)
INTERVAL_S = 1.2  # each pair once per interval: six pairs, a probe every 0.2 s
PAIRS = {f"{p}->{c}" for p in ("e0", "e1", "e2") for c in ("e0", "e1", "e2") if p != c}


class Traffic:
    """Client requests through the router, one every 0.1 s, while a test needs the fleet
    serving: the canary probes only while the router serves."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": "tiny", "prompt": "a steady client", "max_tokens": 2}
        while not self.stop.wait(0.1):
            call(self.port, "POST", "/v1/completions", body, {"x-request-id": "traffic"})

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture(scope="module")
def canaried(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CheckFleet, Router]]:
    with check_fleet(tmp_path_factory.mktemp("canary")) as fleet:
        out = fleet.root / "first-token.json"
        run = run_check(fleet.fleet_path, "--calibrate-first-token", "--calibrate-repeats", "1",
                        "--calibrate-max-tokens", "128", "--calibration-out", str(out),
                        json_out=False)
        assert run.code == 0, run.stdout + run.stderr
        path = fleet.write_fleet(kv_canary={"path": "kv-canary.json", "interval_s": INTERVAL_S,
                                            "release_after": 2},
                                 operations={"open": True})
        router = Router(path, free_port()).start()
        try:
            yield fleet, router
        finally:
            router.stop()


def _canary(router: Router) -> dict[str, Any]:
    state = call(router.port, "GET", "/narwhal/state").json()["kv_canary"]
    assert isinstance(state, dict)
    return state


def _wait(router: Router, what: str, ok: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state = _canary(router)
        if ok(state["pairs"]):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s: {state}")
        time.sleep(0.05)


def test_preflight_records_one_answer_that_every_pair_gave(
        canaried: tuple[CheckFleet, Router]) -> None:
    fleet, _ = canaried
    ref = load_canary(fleet.root / "kv-canary.json")
    assert {f"{p.producer}->{p.consumer}" for p in ref.pairs} == PAIRS
    assert ref.text and ref.max_tokens == 8 and ref.prompt_tokens >= 64
    assert ref.token_logprobs is not None and len(ref.token_logprobs) == 8


def test_an_idle_router_sends_no_probe(canaried: tuple[CheckFleet, Router]) -> None:
    """No client request yet: the engines stay idle (Gate D's fabric samples need them so)."""
    _, router = canaried
    time.sleep(INTERVAL_S)
    assert _canary(router)["probes"] == 0


def test_every_pair_is_probed_and_passes_on_a_healthy_fleet(
        canaried: tuple[CheckFleet, Router]) -> None:
    _, router = canaried
    with Traffic(router.port):
        state = _wait(router, "every pair probed", lambda pairs: set(pairs) == PAIRS,
                      3 * INTERVAL_S)
    assert all(p["verdict"] == "ok" and not p["held"] for p in state["pairs"].values()), state
    assert state["probes_per_hour"] == 6 * 3600 / INTERVAL_S
    assert 0 < state["engine_time_share"] < 0.5


def test_a_pair_whose_consumer_decodes_wrong_kv_is_held_alone_and_serves_no_request(
        canaried: tuple[CheckFleet, Router]) -> None:
    fleet, router = canaried
    e0 = fleet.engines["e0"]
    fault(fleet.engines["e1"], "corrupt_pulls", peer=f"127.0.0.1:{e0.side_channel_port}")
    started = time.monotonic()
    with Traffic(router.port):
        _held_alone_then_released(fleet, router, started)


def _held_alone_then_released(fleet: CheckFleet, router: Router, started: float) -> None:
    try:
        state = _wait(router, "e0->e1 held", lambda pairs: pairs["e0->e1"]["held"],
                      2 * INTERVAL_S + 1.0)
        caught = time.monotonic() - started
        assert caught <= 2 * INTERVAL_S + 0.5, caught  # within two canary periods
        held = state["pairs"]["e0->e1"]
        assert held["verdict"] == "mismatch" and "reference" in held["evidence"]
        state = _wait(router, "every other pair probed again", lambda pairs: all(
            pairs[k]["last_probe_at"] > held["held_since"] for k in PAIRS - {"e0->e1"}),
            2 * INTERVAL_S)
        others = {k: v for k, v in state["pairs"].items() if k != "e0->e1"}
        assert not any(v["held"] for v in others.values()), others
        metrics = call(router.port, "GET", "/metrics").body.decode()
        assert 'narwhal_router_kv_pair_held{consumer="e1",producer="e0"} 1.0' in metrics
        assert 'narwhal_router_kv_pair_held{consumer="e2",producer="e0"} 0.0' in metrics
        assert 'verdict="mismatch"' in metrics
        # clients are served meanwhile, never over the held pair, and every answer is right
        body = {"model": "tiny", "prompt": "the sea and the ships of the world", "max_tokens": 6,
                "temperature": 0}
        answers = {call(router.port, "POST", "/v1/completions", body,
                        {"x-request-id": f"after-{n}"}).json()["choices"][0]["text"]
                   for n in range(24)}
        assert len(answers) == 1
        deadline = time.monotonic() + 5
        while True:
            rows = [r for r in journal_rows(fleet.root / "journal.jsonl")
                    if r["request_id"].startswith("after-")]
            if len(rows) == 24 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(rows) == 24 and all(r["outcome"] == "ok" for r in rows)
        assert not [r for r in rows if r["mode"] == "split" and r["prefill_engine"] == "e0"
                    and r["decode_engine"] == "e1"], rows
        assert any(r["decode_engine"] == "e1" for r in rows)  # the engine itself still serves
    finally:
        fault(fleet.engines["e1"], "clear")
    _wait(router, "e0->e1 released after two passes", lambda pairs: not pairs["e0->e1"]["held"],
          4 * INTERVAL_S)


def test_a_consumer_that_recomputes_instead_of_pulling_is_held_on_its_counters(
        canaried: tuple[CheckFleet, Router]) -> None:
    fleet, router = canaried
    fault(fleet.engines["e2"], "recompute_instead_of_pull")
    with Traffic(router.port):
        try:
            state = _wait(router, "pairs into e2 held", lambda pairs: pairs["e0->e2"]["held"]
                          and pairs["e1->e2"]["held"], 2 * INTERVAL_S + 1.0)
            assert state["pairs"]["e0->e2"]["verdict"] == "recomputed"
            assert "computed the rest itself" in state["pairs"]["e0->e2"]["evidence"]
        finally:
            fault(fleet.engines["e2"], "clear")
        _wait(router, "pairs into e2 released", lambda pairs: not pairs["e0->e2"]["held"]
              and not pairs["e1->e2"]["held"], 4 * INTERVAL_S)


def test_a_canary_reference_for_another_model_stops_the_router_naming_it(
        canaried: tuple[CheckFleet, Router]) -> None:
    fleet, _ = canaried
    ref = json.loads((fleet.root / "kv-canary.json").read_text())
    (fleet.root / "other-canary.json").write_text(json.dumps({**ref, "model": "other"}))
    path = fleet.root / "bad-fleet.json"
    doc = json.loads(fleet.fleet_path.read_text())
    path.write_text(json.dumps({**doc, "kv_canary": {"path": "other-canary.json"}}))
    router = Router(path, free_port())
    with pytest.raises(RuntimeError, match=r"kv_canary\.path"):
        router.start()
