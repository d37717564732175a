"""The sidecar's HTTP surface: GET /v1/attestation (the document, or 503 with the reason) and
GET /health. Anything else a client sends is refused without work: other paths 404, other
methods 405, and a client that sends slowly is cut off after the timeout."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from narwhal.node.attest.document import Attested, Changed, verify

REQUEST_TIMEOUT_S = 5.0


def _handler(attested: Attested) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S  # a slow sender holds one thread for 5 s at most
        server_version = "narwhal-attest"
        sys_version = ""

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, sort_keys=True).encode() + b"\n"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/attestation":
                try:
                    verify(attested)
                except Changed as exc:
                    self._send(503, {"error": str(exc), "engine": attested.document["engine"],
                                     "attested_digest": attested.document["digest"]})
                    return
                self._send(200, attested.document)
            else:
                self._send(404, {"error": "not found: GET /v1/attestation or /health"})

        def _refuse(self) -> None:
            self._send(405, {"error": "method not allowed: GET only"})

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no request log: the journal of record is the workstation's ledger

    return Handler


def serve(attested: Attested, bind: str, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((bind, port), _handler(attested))
    server.daemon_threads = True
    return server
