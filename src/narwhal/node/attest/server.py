"""The sidecar's HTTP surface: GET /v1/attestation (the document, or 503 with the reason),
GET /health, and, when started with a controller key, the lease routes: GET /v1/lease and
POST /v1/lease/{acquire,renew,release} (lease_desk.py).

Anything else a client sends is refused without work: other paths 404, other methods 405, a
lease body without Content-Length 411, a larger one than 4 KiB 413 before a byte of it is
read, and a client that sends slowly is cut off after the timeout, whether it dribbles its
head or its body. The key is never logged or echoed: there is no request log at all.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from narwhal.core.lease_wire import MAX_BODY_BYTES, VERBS
from narwhal.core.sidecar_answer import refusal
from narwhal.node.attest.document import Attested, Changed, verify
from narwhal.node.attest.lease_desk import BAD_KEY, NO_LEASE, LeaseDesk

REQUEST_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 256  # at once, from every client together
PER_CLIENT = 16  # at once from one address: a router, a workstation or a Prometheus needs few
LEASE = "/v1/lease"
_POSTS = {f"{LEASE}/{verb}": verb for verb in VERBS}
_GETS = ("/health", "/metrics", "/v1/attestation", LEASE)


class SidecarHandler(BaseHTTPRequestHandler):
    """One request to the sidecar; `_handler` binds a subclass to its attestation and desk."""

    timeout = REQUEST_TIMEOUT_S  # a slow sender holds one thread for 5 s at most
    server_version = "narwhal-attest"
    sys_version = ""
    attested: Attested
    desk: LeaseDesk | None = None

    def _send(self, status: int, body: dict[str, Any],
              headers: tuple[tuple[str, str], ...] = ()) -> None:
        data = json.dumps(body, sort_keys=True).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _metrics(self) -> None:
        """Prometheus text: whether the sidecar vouches for its engine now, and how many
        connections its bounds closed. A scrape re-checks the engine like any GET."""
        try:
            verify(self.attested)
            vouches = 1
        except Changed:
            vouches = 0
        engine = str(self.attested.document["engine"]).replace("\\", "").replace('"', "")
        refused = getattr(self.server, "refused", 0)
        data = (
            "# HELP narwhal_attestation_vouches 1 while the sidecar vouches for the live "
            "engine, 0 once it changed\n# TYPE narwhal_attestation_vouches gauge\n"
            f'narwhal_attestation_vouches{{engine="{engine}"}} {vouches}\n'
            "# HELP narwhal_attestation_refused_connections_total Connections closed over "
            "the per-client or total bound\n"
            "# TYPE narwhal_attestation_refused_connections_total counter\n"
            f"narwhal_attestation_refused_connections_total {refused}\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _attestation(self) -> None:
        """The document while the live engine is the attested one; else 503 with its kind."""
        try:
            verify(self.attested)
        except Changed as exc:
            self._send(503, refusal(exc.kind, str(exc), self.attested.document["engine"],
                                    self.attested.document["digest"]))
            return
        self._send(200, self.attested.document)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/metrics":
            self._metrics()
        elif self.path == "/v1/attestation":
            self._attestation()
        elif self.path == LEASE:
            self._send(*(self.desk.state() if self.desk is not None
                         else (404, {"error": NO_LEASE})))
        elif self.path in _POSTS:
            self._send(405, {"error": f"method not allowed: POST {self.path}"},
                       (("Allow", "POST"),))
        else:
            self._send(404, {"error": "not found: GET /v1/attestation, /health, /metrics "
                             "or /v1/lease, or POST /v1/lease/{acquire,renew,release}"})

    def do_POST(self) -> None:
        verb = _POSTS.get(self.path)
        if verb is None:
            if self.path in _GETS:
                self._send(405, {"error": f"method not allowed: GET {self.path}"},
                           (("Allow", "GET"),))
            else:
                self._send(404, {"error": "not found: POST /v1/lease/{acquire,renew,release}"})
            return
        if self.desk is None:
            self._send(404, {"error": NO_LEASE})
            return
        if not self.desk.authorized(self.headers.get("Authorization")):
            self._send(401, {"error": BAD_KEY}, (("WWW-Authenticate", "Bearer"),))
            return
        body = self._body()
        if body is not None:
            self._send(*self.desk.post(verb, body))

    def _body_length(self) -> int | None:
        """The announced body length when the headers allow reading it; else None, answered."""
        if self.headers.get("Transfer-Encoding") is not None:
            self._send(411, {"error": "send the body with Content-Length, not chunked"})
            return None
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._send(411, {"error": "a lease request needs Content-Length"})
            return None
        if not (length_text.isascii() and length_text.isdigit()):  # "²" is a digit too
            self._send(400, {"error": "Content-Length is not a whole number"})
            return None
        length = int(length_text)
        if length > MAX_BODY_BYTES:  # refused unread; the connection closes after it
            self._send(413, {"error": f"body of {length} bytes is larger than "
                             f"{MAX_BODY_BYTES}"})
            return None
        return length

    def _body(self) -> bytes | None:
        """The request body, at most MAX_BODY_BYTES, read before the request deadline."""
        length = self._body_length()
        if length is None:
            return None
        # One deadline for the whole body: a sender that dribbles a byte every few seconds
        # would otherwise pass every per-read timeout and hold this thread for hours.
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        chunks: list[bytes] = []
        left = length
        while left > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("lease body not sent in time")
            self.connection.settimeout(remaining)
            chunk = self.rfile.read1(left)
            if not chunk:
                raise ConnectionError("client closed before sending its body")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _refuse(self) -> None:
        self._send(405, {"error": "method not allowed: GET, or POST on /v1/lease/*"})

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no request log: the journal of record is the workstation's ledger

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError):
            self.close_connection = True  # cut off: nothing is owed to this client


def _handler(attested: Attested, desk: LeaseDesk | None) -> type[SidecarHandler]:
    """The handler class of one sidecar: SidecarHandler bound to its attestation and desk
    (http.server makes one handler per request from a class, so the binding is the class's)."""
    return type("Handler", (SidecarHandler,), {"attested": attested, "desk": desk})


class BoundedServer(ThreadingHTTPServer):
    """One thread per connection, with two bounds: at most PER_CLIENT connections at once from
    one address and MAX_CONNECTIONS in all. A connection over either bound is closed at once.
    So a flood from one host of the fabric network (each connection also cut after
    REQUEST_TIMEOUT_S) cannot take the threads the router's lease renewals, the workstation's
    fetches and Prometheus need: they come from other addresses."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int],
                 handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self.refused = 0

    def _take(self, client: str) -> bool:
        with self._lock:
            if self._open.get(client, 0) >= PER_CLIENT \
                    or sum(self._open.values()) >= MAX_CONNECTIONS:
                self.refused += 1
                return False
            self._open[client] = self._open.get(client, 0) + 1
            return True

    def _give(self, client: str) -> None:
        with self._lock:
            left = self._open.get(client, 1) - 1
            if left > 0:
                self._open[client] = left
            else:
                self._open.pop(client, None)

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0])
        if not self._take(client):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give(client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give(str(client_address[0]))


def serve(attested: Attested, bind: str, port: int,
          desk: LeaseDesk | None = None) -> ThreadingHTTPServer:
    return BoundedServer((bind, port), _handler(attested, desk))
