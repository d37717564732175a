"""`narwhal status` asks the router host whether the router Gate G left serving still answers
(the runbook's row "Router restart with the same fleet document"): a real `narwhal-attest
fetch` against loopback, from a record whose serve attempt passed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.deploy.gates.live_check import router_down
from narwhal.deploy.hosts import LocalHost
from narwhal.deploy.ledger import Ledger
from narwhal.lab.engine.testing import free_port

FETCH = shutil.which("narwhal-attest") or str(Path(sys.executable).parent / "narwhal-attest")


def _served(tmp_path: Path, port: int) -> Ledger:
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    with ledger.attempt("serve", fingerprint={}, hosts={"router": ["router"]},
                        deployment_revision="") as attempt:
        attempt.add_artifact("plan.json", json.dumps(
            {"router_host": "router", "router_url": f"http://127.0.0.1:{port}"}).encode())
    return ledger


# A router that answers /ready with 503 and a JSON body: it answers, not ready (no admitted
# engine, say); the engines' own states are the live check's other question.
NOT_READY = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"ready": false}'
        self.send_response(503); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def answering() -> Iterator[int]:
    """Something that answers /ready on a loopback port, as a router that is not ready."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", NOT_READY, str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                assert time.monotonic() < deadline, "the stand-in server did not start"
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_router_that_answers_is_not_down(tmp_path: Path, answering: int) -> None:
    assert router_down(_served(tmp_path, answering), LocalHost("router"), FETCH) == ""


def test_a_router_that_does_not_answer_is_named_with_its_address_and_host(
        tmp_path: Path) -> None:
    port = free_port()
    why = router_down(_served(tmp_path, port), LocalHost("router"), FETCH)
    assert f"the router at http://127.0.0.1:{port} on router does not answer" in why
    assert "no narwhal-serve that gate G started runs there" in why


def test_before_gate_g_passed_there_is_no_router_to_ask(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    assert router_down(ledger, LocalHost("router"), FETCH) == ""
