"""The hub double's two HTTP origins: the API (`/api/...` and `/{repo}/resolve/...`) and the
CDN that LFS downloads are redirected to (`/lfs/<sha256>?expires=..&signature=..`).

They listen on two ports so that they are two origins to the client, as huggingface.co and
its CDN are: the client stops at the API's 302, reads the LFS file's metadata from it
(`X-Linked-Etag`, `X-Linked-Size`) and fetches the signed URL without its token.

Bounds, each named: one socket timeout for slow senders and readers, the stdlib's request
line and header limits (64 KiB a line, 100 headers; 414 and 431), a cap on connections served
at once, no request body ever read (a GET or HEAD with one is 400, any other method 405 and
the connection closed).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, TextIO
from urllib.parse import urlsplit

from narwhal.lab.hub import cdn, ranges, routes
from narwhal.lab.hub.api import FileBody, Reply, answer, error, refusal
from narwhal.lab.hub.store import Store

SOCKET_TIMEOUT_S = 15.0
MAX_CONNECTIONS = 64
CHUNK_BYTES = 64 * 1024
SEEN_KEPT = 512


class Faults:
    """Faults the double injects into its own answers (thread-safe, each used once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cuts: dict[str, int] = {}

    def cut_once(self, sha256: str, after_bytes: int) -> None:
        """The next body of this object stops after `after_bytes` and the connection closes,
        as a dropped link does mid-download."""
        with self._lock:
            self._cuts[sha256] = after_bytes

    def take_cut(self, sha256: str) -> int | None:
        with self._lock:
            return self._cuts.pop(sha256, None)


@dataclass(frozen=True)
class Seen:
    """One request as the double answered it (never its token: only whether one came)."""

    origin: Literal["api", "cdn"]
    method: str
    path: str  # without the query
    status: int
    range: str | None
    authorized: bool


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 hub: HubServer) -> None:
        self.hub = hub
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the cap: refused at once, not queued
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.hub.note(f"error serving {client_address[0]}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "narwhal-lab-hub/1"
    sys_version = ""
    timeout = SOCKET_TIMEOUT_S
    origin: Literal["api", "cdn"] = "api"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.hub.socket_timeout)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # the path without its query: a CDN query is a signed permission
        self.server.hub.note(f"{self.address_string()} {self.command} "
                             f"{urlsplit(self.path).path!r} {code}")

    def log_message(self, format: str, *args: Any) -> None:
        self.server.hub.note(f"{self.address_string()} {(format % args)!r}")

    def answer(self) -> Reply:
        raise NotImplementedError

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _refuse_method(self) -> None:
        self.close_connection = True  # its body, if any, is never read
        self._write(error(405, "", f"{self.command} is not served here; only GET and HEAD",
                          ("Allow", "GET, HEAD")), head=False)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method

    def token(self) -> str | None:
        value = self.headers.get("Authorization", "")
        scheme, _, credential = value.partition(" ")
        return (credential.strip() or None) if scheme.lower() == "bearer" else None

    def _serve(self, head: bool) -> None:
        if self.headers.get("Content-Length", "0").strip() not in ("", "0") or \
                "Transfer-Encoding" in self.headers:
            self.close_connection = True
            reply = error(400, "", "a GET or HEAD request carries no body")
        else:
            reply = self.answer()
        self._write(reply, head)

    def _write(self, reply: Reply, head: bool) -> None:
        status = reply.status
        try:
            if isinstance(reply.body, FileBody):
                status = self._write_file(reply, reply.body, head)
            else:
                self._head(status, reply.headers, len(reply.body))
                if not head:
                    self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        self.server.hub.seen.append(Seen(self.origin, self.command, urlsplit(self.path).path,
                                         status, self.headers.get("Range"),
                                         "Authorization" in self.headers))

    def _head(self, status: int, headers: list[tuple[str, str]], length: int) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _write_file(self, reply: Reply, body: FileBody, head: bool) -> int:
        span = ranges.span(self.headers.get("Range"), body.size)
        if isinstance(span, ranges.Unsatisfiable):
            self._head(416, [("Content-Range", span.content_range())], 0)
            return 416
        status = 206 if span.partial else reply.status
        extra = [("Content-Range", span.content_range())] if span.partial else []
        self._head(status, [*reply.headers, *extra], span.length)
        if head:
            return status
        cut = self.server.hub.faults.take_cut(body.path.name)
        left = span.length if cut is None else min(cut, span.length)
        with open(body.path, "rb") as f:
            f.seek(span.start)
            while left > 0:
                chunk = f.read(min(CHUNK_BYTES, left))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)
        if cut is not None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        return status


class ApiHandler(_Handler):
    origin = "api"

    def answer(self) -> Reply:
        route = routes.parse(self.path)
        if isinstance(route, routes.Refusal):
            return refusal(route)
        hub = self.server.hub
        return answer(hub.store, route, self.token(), hub.cdn_url)


class CdnHandler(_Handler):
    origin = "cdn"

    def answer(self) -> Reply:
        split = urlsplit(self.path)
        match = cdn.OBJECT_PATH.match(split.path)
        if match is None:
            return error(404, "", "Not Found")
        hub, sha256 = self.server.hub, match.group(1)
        verdict = cdn.check(hub.key, sha256, split.query, time.time())
        if verdict is not cdn.Check.OK:
            return error(403, "", "Request has expired" if verdict is cdn.Check.EXPIRED
                         else "The request signature does not match")
        path = hub.store.object_path(sha256)
        if not path.is_file():
            return error(404, "", "Not Found")
        return Reply(200, [("ETag", f'"{sha256}"'), ("Accept-Ranges", "bytes"),
                           ("Content-Type", "application/octet-stream")],
                     FileBody(path, path.stat().st_size))


class HubServer:
    """Both origins bound at construction (so the ports are known), served by start()."""

    def __init__(self, store: Store, host: str, port: int, cdn_port: int,
                 log: TextIO | None = None, socket_timeout: float = SOCKET_TIMEOUT_S) -> None:
        self.store = store
        self.socket_timeout = socket_timeout
        self.key = secrets.token_bytes(32)  # signs CDN URLs; dies with the process
        self.faults = Faults()
        self.seen: deque[Seen] = deque(maxlen=SEEN_KEPT)
        self._log = log
        self._log_lock = threading.Lock()
        self.api = _Server((host, port), ApiHandler, self)
        try:
            self.cdn = _Server((host, cdn_port), CdnHandler, self)
        except BaseException:
            self.api.server_close()
            raise
        self._threads: list[threading.Thread] = []

    @property
    def endpoint(self) -> str:
        host, port = self.api.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def cdn_base(self) -> str:
        host, port = self.cdn.server_address[:2]
        return f"http://{host!s}:{port}"

    def cdn_url(self, sha256: str) -> str:
        return cdn.object_url(self.cdn_base, self.key, sha256, time.time())

    def note(self, line: str) -> None:
        if self._log is not None:
            with self._log_lock:
                self._log.write(f"narwhal-lab-hub: {line}\n")
                self._log.flush()

    def start(self) -> None:
        """Serve both origins from background threads."""
        for server in (self.api, self.cdn):
            thread = threading.Thread(target=server.serve_forever, daemon=True,
                                      name=f"hub-{server.server_address[1]}")
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        for server in (self.api, self.cdn):
            if self._threads:
                server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
