"""narwhal-serve holds an engine out of placement while its attestation sidecar does not vouch
for it: a real emulator engine started by `narwhal-engine`, its real `narwhal-attest` sidecar,
and a fleet document as Gate E writes it (attestation_url and contract per engine)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from narwhal.lab.engine.testing import free_port
from tests.component.attest.sidecars import Attested
from tests.component.serve.harness import Router, call
from tests.native_engine import engine

pytestmark = pytest.mark.timeout(180)


def _engine(router: Router) -> dict[str, Any]:
    return dict(call(router.port, "GET", "/narwhal/state").json()["engines"][0])


def _wait(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_an_attested_engine_serves_and_a_restarted_one_is_held_out_with_the_reason(
        attested: Attested) -> None:
    router = Router(attested.fleet(), free_port()).start()
    try:
        assert _engine(router)["held_reason"] is None
        done = call(router.port, "POST", "/v1/completions",
                    {"model": "tiny", "prompt": "the sea", "max_tokens": 2})
        assert done.status == 200, done.body
        run_dir = str(attested.run_dir)
        assert engine("stop", "--run-dir", run_dir).ok
        assert engine("start", "--run-dir", run_dir).ok  # same plan, a new process
        # While the old process shuts down its port closes first, so a sweep may hold the
        # engine as "not answering"; the sweep after the restart must name the new process.
        _wait("the hold", lambda: _engine(router)["held_reason"] == "attestation"
              and "engine process changed" in _engine(router)["held_detail"])
        state = _engine(router)
        assert not state["admitted"]
        metrics = call(router.port, "GET", "/metrics").body.decode()
        assert 'narwhal_router_engine_held{engine="e0",reason="attestation"} 1.0' in metrics
    finally:
        router.stop()


def test_a_fleet_whose_contract_is_not_the_sidecars_holds_the_engine_from_the_start(
        attested: Attested) -> None:
    router = Router(attested.fleet(attestation_digest="sha256:" + "0" * 64), free_port())
    router.start(wait_ready=False)
    try:
        _wait("the first sweep", lambda: _engine(router)["held_reason"] == "attestation")
        assert "is not the fleet's contract" in _engine(router)["held_detail"]
    finally:
        router.stop()
