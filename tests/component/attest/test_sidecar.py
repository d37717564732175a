"""narwhal-attest on loopback: the sidecar of an engine that `narwhal-engine` started from a
launch record (native runtime, the engine emulator). It serves the attestation of that live
process, answers 503 with the reason the moment the process changes, refuses what is not a
GET of its two paths, survives a slow sender, and will not attest a run dir whose plan was
edited after `check`."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.core import result_line
from narwhal.core.documents import digest
from narwhal.lab.engine.testing import free_port
from narwhal.node.attest.server import PER_CLIENT
from tests.component.attest.sidecars import engine_with_sidecar, serve
from tests.native_engine import engine

pytestmark = pytest.mark.timeout(180)


@dataclass
class Sidecar:
    run_dir: Path
    port: int
    layout: dict[str, Any]

    def get(self, path: str = "/v1/attestation", method: str = "GET") -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path)
            reply = conn.getresponse()
            return reply.status, json.loads(reply.read())
        finally:
            conn.close()


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    with engine_with_sidecar(tmp_path) as e:
        yield Sidecar(e.run_dir, e.port, e.layout)


def test_the_attestation_is_the_captured_engine_bound_to_its_live_process(
        sidecar: Sidecar) -> None:
    status, doc = sidecar.get()
    assert status == 200, doc
    assert doc["schema"] == "narwhal.engine-attestation" and doc["engine"] == "e0"
    assert doc["compatibility_hash"] == sidecar.layout["ranks"][0]["compatibility_hash"]
    assert doc["process"]["process_start_time_seconds"] == \
        sidecar.layout["process_start_time_seconds"]
    assert doc["launch_record_sha256"] == sidecar.layout["launch_record_sha256"]
    assert doc["vllm_version"] == sidecar.layout["version"]
    assert doc["kv_transfer_config"]["kv_role"] == "kv_both"
    body = {k: v for k, v in doc.items() if k != "digest"}
    assert doc["digest"] == digest(body)


def test_a_restarted_engine_is_refused_with_the_reason_at_once(sidecar: Sidecar) -> None:
    assert sidecar.get()[0] == 200
    run_dir = str(sidecar.run_dir)
    assert engine("state", "--run-dir", run_dir).data["running"] is True
    assert engine("stop", "--run-dir", run_dir).ok
    status, body = sidecar.get()
    assert status == 503 and "engine process changed" in body["error"], body
    assert body["kind"] == "process_changed", body
    # what `narwhal status` asks the engine's host when a sidecar says this
    state = engine("state", "--run-dir", run_dir).data
    assert state["started"] is True and state["running"] is False, state
    assert engine("start", "--run-dir", run_dir).ok  # same plan, a new process
    assert engine("state", "--run-dir", run_dir).data["running"] is True
    assert engine("capture", "--run-dir", run_dir, "--timeout", "60", timeout=160).ok
    status, body = sidecar.get()
    assert status == 503 and "engine process changed" in body["error"], body  # no re-binding


def test_only_a_get_of_its_two_paths_is_answered(sidecar: Sidecar) -> None:
    assert sidecar.get("/health") == (200, {"status": "ok"})
    assert sidecar.get("/v1/attestation/../../etc/passwd")[0] == 404
    assert sidecar.get("/v1/attestation", method="POST")[0] == 405
    assert sidecar.get("/v1/attestation", method="DELETE")[0] == 405


def test_a_slow_sender_is_cut_off_and_others_are_served_meanwhile(sidecar: Sidecar) -> None:
    slow = socket.create_connection(("127.0.0.1", sidecar.port), timeout=15)
    try:
        slow.sendall(b"GET /v1/attestation HTTP/1.1\r\nHost: x\r\n")  # never finishes
        t0 = time.monotonic()
        assert sidecar.get()[0] == 200  # another client is not held up by it
        assert slow.recv(1024) == b""  # closed by the sidecar, not by us
        assert 4.0 <= time.monotonic() - t0 < 12.0
    finally:
        slow.close()


def test_its_metrics_say_whether_it_vouches_now(sidecar: Sidecar) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'narwhal_attestation_vouches{engine="e0"} 1' in text
    assert engine("stop", "--run-dir", str(sidecar.run_dir)).ok
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.port}/metrics", timeout=10) as r:
        assert 'narwhal_attestation_vouches{engine="e0"} 0' in r.read().decode()


def test_a_connection_flood_from_one_address_does_not_shut_out_another(
        sidecar: Sidecar) -> None:
    """The per-client bound: connections over PER_CLIENT from one address are closed at once,
    while a client from another address (the router) is answered meanwhile."""
    flood = []
    try:
        for _ in range(PER_CLIENT + 24):
            s = socket.create_connection(("127.0.0.1", sidecar.port), timeout=5)
            s.sendall(b"GET /v1/attestation HTTP/1.1\r\nHost: x\r\n")  # never finishes
            flood.append(s)
        for s in flood:
            s.settimeout(0.5)
        closed = 0
        for s in flood:
            with contextlib.suppress(TimeoutError):  # a timeout: held in one of the slots
                closed += s.recv(1024) == b""
        assert closed >= 24
        other = http.client.HTTPConnection("127.0.0.1", sidecar.port, timeout=5,
                                           source_address=("127.0.0.2", 0))
        other.request("GET", "/v1/attestation")
        assert other.getresponse().status == 200
        other.close()
    finally:
        for s in flood:
            s.close()


def test_a_plan_edited_after_check_is_not_attested(sidecar: Sidecar) -> None:
    plan = sidecar.run_dir / "launch.json"
    doc = json.loads(plan.read_text())
    doc["image_id"] = "sha256:" + "0" * 64
    plan.write_text(json.dumps(doc))
    other = serve(sidecar.run_dir, free_port())
    out, _ = other.communicate(timeout=30)
    assert other.returncode == 1
    assert "not the one `check` passed" in result_line.parse(out, "narwhal-attest serve").error
