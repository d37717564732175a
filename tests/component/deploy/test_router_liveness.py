"""`narwhal status` asks the router host whether the routers Gate G left serving still serve
(the runbook's row "Router restart with the same fleet document", and the warm standby): a
real `narwhal-attest fetch` against stand-in routers on loopback, from a record whose serve
attempt passed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from narwhal.deploy.gates.live_check import router_down
from narwhal.deploy.hosts import LocalHost
from narwhal.deploy.ledger import Ledger
from narwhal.lab.engine.testing import free_port

FETCH = shutil.which("narwhal-attest") or str(Path(sys.executable).parent / "narwhal-attest")
# A router's /narwhal/state as far as the live check reads it: its controller role.
STAND_IN = """
import http.server, json, sys
role = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"model": "m", "controller": {"role": role}}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _served(tmp_path: Path, port: int, standby: int | None = None) -> Ledger:
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    with ledger.attempt("serve", fingerprint={}, hosts={"router": ["router"]},
                        deployment_revision="") as attempt:
        attempt.add_artifact("plan.json", json.dumps(
            {"router_host": "router", "router_url": f"http://127.0.0.1:{port}",
             "standby_url": f"http://127.0.0.1:{standby}" if standby else None}).encode())
    return ledger


@pytest.fixture
def router_at() -> Iterator[Callable[[str], int]]:
    """Start a stand-in router answering as `role`; its loopback port."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(role: str) -> int:
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-c", STAND_IN, str(port), role],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                return port
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < deadline, "the stand-in router did not start"
                time.sleep(0.1)
    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def test_a_primary_that_answers_is_not_down(tmp_path: Path,
                                            router_at: Callable[[str], int]) -> None:
    assert router_down(_served(tmp_path, router_at("primary")), LocalHost("router"), FETCH) == ""


def test_a_router_that_does_not_answer_is_named_with_its_address_and_host(
        tmp_path: Path) -> None:
    port = free_port()
    why = router_down(_served(tmp_path, port), LocalHost("router"), FETCH)
    assert f"the router at http://127.0.0.1:{port} on router does not answer as primary" in why
    assert "no narwhal-serve that gate G started runs there" in why


def test_a_router_that_only_stands_by_is_not_serving(
        tmp_path: Path, router_at: Callable[[str], int]) -> None:
    why = router_down(_served(tmp_path, router_at("standby")), LocalHost("router"), FETCH)
    assert "does not answer as primary" in why


def test_a_primary_with_its_standby_is_serving(tmp_path: Path,
                                               router_at: Callable[[str], int]) -> None:
    ledger = _served(tmp_path, router_at("primary"), router_at("standby"))
    assert router_down(ledger, LocalHost("router"), FETCH) == ""


def test_after_a_takeover_no_standby_is_left_and_that_is_named(
        tmp_path: Path, router_at: Callable[[str], int]) -> None:
    gone, took_over = free_port(), router_at("primary")
    why = router_down(_served(tmp_path, gone, took_over), LocalHost("router"), FETCH)
    assert why == (f"no warm standby on router: the standby at http://127.0.0.1:{took_over} "
                   f"took over as primary and nothing stands by at http://127.0.0.1:{gone}")


def test_a_standby_that_is_gone_is_named(tmp_path: Path,
                                         router_at: Callable[[str], int]) -> None:
    primary, gone = router_at("primary"), free_port()
    why = router_down(_served(tmp_path, primary, gone), LocalHost("router"), FETCH)
    assert why == f"no warm standby on router: the standby at http://127.0.0.1:{gone} does " \
                  "not answer"


def test_before_gate_g_passed_there_is_no_router_to_ask(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    assert router_down(ledger, LocalHost("router"), FETCH) == ""
