"""`narwhal status` asks the router host whether the Prometheus Gate G started still runs and
answers: a real `narwhal-attest fetch` against a stand-in Prometheus on loopback, started and
owned by a passed serve attempt as Gate G starts its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.deploy.gates.live_check import prometheus_down
from narwhal.deploy.hosts import LocalHost
from narwhal.deploy.hosts.base import ProcessRef
from narwhal.deploy.ledger import Ledger
from narwhal.lab.engine.testing import free_port

FETCH = shutil.which("narwhal-attest") or str(Path(sys.executable).parent / "narwhal-attest")
# Prometheus's query API as far as the live check reads it: a JSON answer to `up`.
STAND_IN = """
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "success", "data": {"result": []}}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
HOST = LocalHost("router")


def _served(tmp_path: Path, port: int, argv: list[str]) -> tuple[Ledger, ProcessRef]:
    """A passed serve attempt whose Prometheus (owned, `serves` prometheus) is `argv`."""
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    with ledger.attempt("serve", fingerprint={}, hosts={"router": ["router"]}) as attempt:
        attempt.add_artifact("plan.json", json.dumps(
            {"router_host": "router", "router_url": "http://127.0.0.1:1",
             "prometheus_url": f"http://127.0.0.1:{port}"}).encode())
        ref = attempt.start_process(HOST, argv, str(tmp_path / "prometheus.log"),
                                    serves="prometheus")
    return ledger, ref


@pytest.fixture
def started() -> Iterator[list[ProcessRef]]:
    """Every stand-in a test starts, ended by its pid afterwards if it still is that process."""
    refs: list[ProcessRef] = []
    yield refs
    for ref in refs:
        if HOST.process_start(ref.pid) == ref.start_ticks:
            os.kill(ref.pid, signal.SIGKILL)


def _answering(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
            return
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, "the stand-in Prometheus did not start"
            time.sleep(0.1)


def test_a_prometheus_that_runs_and_answers_is_not_down(
        tmp_path: Path, started: list[ProcessRef]) -> None:
    port = free_port()
    ledger, ref = _served(tmp_path, port, [sys.executable, "-c", STAND_IN, str(port)])
    started.append(ref)
    _answering(port)
    assert prometheus_down(ledger, HOST, FETCH) == ""


def test_a_prometheus_that_died_is_named_gone_with_its_address_and_host(
        tmp_path: Path, started: list[ProcessRef]) -> None:
    port = free_port()
    ledger, ref = _served(tmp_path, port, [sys.executable, "-c", STAND_IN, str(port)])
    started.append(ref)
    _answering(port)
    os.kill(ref.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while HOST.process_start(ref.pid) == ref.start_ticks and time.monotonic() < deadline:
        time.sleep(0.05)
    why = prometheus_down(ledger, HOST, FETCH)
    assert why.startswith(f"Prometheus at http://127.0.0.1:{port} on router is gone "
                          f"(pid {ref.pid}"), why


def test_a_prometheus_that_runs_but_does_not_answer_is_down(
        tmp_path: Path, started: list[ProcessRef]) -> None:
    port = free_port()  # nothing listens there: the process runs, hung or never bound
    ledger, ref = _served(tmp_path, port, ["sleep", "60"])
    started.append(ref)
    why = prometheus_down(ledger, HOST, FETCH)
    assert "does not answer" in why and f"pid {ref.pid} still runs" in why


def test_before_gate_g_passed_there_is_no_prometheus_to_ask(tmp_path: Path) -> None:
    assert prometheus_down(Ledger(tmp_path / "runs", "demo").ensure(), HOST, FETCH) == ""
