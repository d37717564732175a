"""Gate G's private-path check against a real HTTP server standing in for the router at the
workstation's end of the SSH forward: /ready is asked until it says 200 (a router that just
started can lose its lease once while it loads a large fleet), the completion is sent once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from narwhal.deploy.gates.serve import ServePlan, through_router


class Router:
    """Answers /ready with 503 `unready` times, then 200; counts completions."""

    def __init__(self, unready: int) -> None:
        self.unready, self.ready_asked, self.completions = unready, 0, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.ready_asked += 1
                self._reply(503 if owner.ready_asked <= owner.unready else 200, b"{}")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.completions += 1
                self._reply(200, json.dumps({"choices": [{"text": " waves"}]}).encode())

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def plan() -> ServePlan:
    return ServePlan(router="router", install={}, fleet={"model": "m"}, fleet_sha256="",
                     bind=("127.0.0.1", 8000))


@pytest.fixture
def routers() -> Iterator[list[Router]]:
    made: list[Router] = []
    yield made
    for r in made:
        r.server.shutdown()
        r.server.server_close()


def test_a_router_that_becomes_ready_is_asked_again_and_served_one_completion(
        plan: ServePlan, routers: list[Router]) -> None:
    router = Router(unready=2)
    routers.append(router)
    got = through_router(router.port, plan, None, ready_s=10.0)
    assert (got["ready"], got["completion"], got["ready_polls"]) == (200, 200, 3)
    assert router.completions == 1


def test_a_router_that_never_becomes_ready_fails_within_the_bound(
        plan: ServePlan, routers: list[Router]) -> None:
    router = Router(unready=10**6)
    routers.append(router)
    started = time.monotonic()
    got = through_router(router.port, plan, None, ready_s=1.2)
    assert got["ready"] == 503 and got["ready_polls"] >= 2
    assert time.monotonic() - started < 1.2 + 2.0


def test_nothing_listening_is_status_zero_not_a_hang(plan: ServePlan) -> None:
    probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()  # a port nothing listens on
    got = through_router(port, plan, None, ready_s=0.6)
    assert got["ready"] == 0 and got["completion"] == 0
