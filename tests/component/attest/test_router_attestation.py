"""narwhal-serve holds an engine out of placement while its attestation sidecar does not vouch
for it: a real emulator engine started by `narwhal-engine`, its real `narwhal-attest` sidecar,
and a fleet document as Gate E writes it (attestation_url and contract per engine)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import free_port
from tests.component.attest.sidecars import engine_with_sidecar
from tests.component.serve.harness import Router, call
from tests.native_engine import engine

pytestmark = pytest.mark.timeout(180)


@dataclass
class Attested:
    root: Path
    run_dir: Path
    engine_url: str
    attestation_url: str
    document: dict[str, Any]

    def fleet(self, **contract: str) -> Path:
        path = self.root / "fleet.json"
        path.write_text(json.dumps({
            "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
            "engines": [{"id": "e0", "url": self.engine_url, "role": "both",
                         "attestation_url": self.attestation_url, "contract": {
                             "compatibility_hash": self.document["compatibility_hash"],
                             "launch_record_sha256": self.document["launch_record_sha256"],
                             "attestation_digest": self.document["digest"], **contract}}],
            "slo": {"ttft_s": 5.0, "tpot_s": 1.0}, "journal": {"path": "journal.jsonl"},
            "health": {"probe_interval_s": 0.3, "probe_timeout_s": 2.0}}))
        return path


@pytest.fixture
def attested(tmp_path: Path) -> Iterator[Attested]:
    with engine_with_sidecar(tmp_path) as e:
        doc = call(e.port, "GET", "/v1/attestation").json()
        yield Attested(tmp_path, e.run_dir, f"http://127.0.0.1:{e.engine_port}",
                       f"http://127.0.0.1:{e.port}/v1/attestation", doc)


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
        _wait("the hold", lambda: _engine(router)["held_reason"] == "attestation")
        state = _engine(router)
        assert "engine process changed" in state["held_detail"]
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
