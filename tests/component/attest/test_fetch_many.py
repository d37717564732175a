"""`narwhal-attest fetch-many`: `narwhal status` asks every sidecar from the router host in one
round trip. Real command, real HTTP servers on loopback: each answer in the order asked, a
refusal or an unreachable sidecar reported for its own URL only, and an answer without bound
refused."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.core.errors import HostError
from narwhal.deploy.gates.restarts import sidecar_answers
from narwhal.deploy.hosts.local import LocalHost
from narwhal.node.attest_cli import MAX_DOCUMENT_BYTES

TOOL = shutil.which("narwhal-attest") or str(Path(sys.executable).parent / "narwhal-attest")


class Sidecars(http.server.BaseHTTPRequestHandler):
    """/ok: an attestation; /refuses: a 503 with its kind; /huge: more than the bound."""

    def do_GET(self) -> None:
        if self.path == "/huge":
            body = b'{"pad": "' + b"x" * (MAX_DOCUMENT_BYTES + 10) + b'"}'
            status = 200
        elif self.path == "/refuses":
            body, status = json.dumps({"error": "engine restarted",
                                       "kind": "process_changed"}).encode(), 503
        else:
            body, status = json.dumps({"digest": "sha256:" + "a" * 64,
                                       "path": self.path}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sidecars)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_sidecar_is_answered_in_the_order_asked_each_for_itself(base: str) -> None:
    urls = [f"{base}/e{i}" for i in range(20)] + [f"{base}/refuses",
                                                   f"http://127.0.0.1:{_closed_port()}/gone"]
    got = sidecar_answers(LocalHost("router"), TOOL, urls)
    assert [a.data.get("document", {}).get("path") for a in got[:20]] == [
        f"/e{i}" for i in range(20)]
    assert all(a.ok and a.data["status"] == 200 for a in got[:20])
    refused, gone = got[20], got[21]
    assert refused.ok and refused.data["status"] == 503
    assert refused.data["document"]["kind"] == "process_changed"
    assert not gone.ok and "refused" in gone.error.lower() and "status" not in gone.data


def test_an_answer_past_the_bound_is_refused_for_that_sidecar_only(base: str) -> None:
    got = sidecar_answers(LocalHost("router"), TOOL, [f"{base}/huge", f"{base}/e1"])
    assert not got[0].ok and f"more than {MAX_DOCUMENT_BYTES} bytes" in got[0].error
    assert got[1].ok and got[1].data["document"]["path"] == "/e1"


def test_a_host_whose_command_prints_no_result_names_the_host() -> None:
    with pytest.raises(HostError, match=r"router: .*fetch-many.* printed no result line"):
        sidecar_answers(LocalHost("router"), "true", ["http://127.0.0.1:1/x"])
