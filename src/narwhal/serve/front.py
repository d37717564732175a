"""The client-facing HTTP/1.1 server: a small asyncio protocol over httptools' C parser.

It keeps only the headers the router acts on (authorization, x-request-id, content-length,
expect), enforces the body limit while bytes arrive (413 before the body is buffered), and
serves one request at a time per connection: pipelined requests wait in a short queue.
Whoever answers a request calls `finish()` once, which frees the connection for the next.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, cast

import httptools

from narwhal.serve import responses

_MAX_PIPELINED = 16
_DISCARD_CAP = 64 * 1_048_576


class Request:
    """One parsed client request."""

    __slots__ = ("auth", "body", "expect_continue", "http11", "keep_alive", "method", "path",
                 "request_id", "too_large")

    def __init__(self) -> None:
        self.method = b""
        self.path = b""
        self.auth = b""
        self.request_id = b""
        self.body = b""
        self.keep_alive = True
        self.http11 = True
        self.too_large = False
        self.expect_continue = False


class Handler(Protocol):
    def handle(self, conn: ClientConnection, request: Request) -> None: ...

    def refused(self, status: int) -> None:
        """Count a request the connection refused before it reached `handle`."""


class Watcher(Protocol):
    """The in-flight call on a connection, told when the client goes away or pushes back."""

    def client_gone(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class ClientConnection(asyncio.Protocol):
    """One client TCP connection."""

    __slots__ = ("_body", "_discarded", "_pending", "_refusal_sent", "_req", "_size", "_url", "busy", "closed",
                 "closing", "handler", "max_body", "parser", "registry", "transport",
                 "watcher", "write_paused")

    def __init__(self, handler: Handler, max_body: int, registry: set[ClientConnection]) -> None:
        self.handler = handler
        self.max_body = max_body
        self.registry = registry
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.closed = False
        self.closing = False
        self.write_paused = False
        self.watcher: Watcher | None = None
        self._pending: deque[Request] = deque()
        self._req = Request()
        self._body: list[bytes] = []
        self._size = 0
        self._url = b""
        self._discarded = -1  # >= 0 while a refused body is being read and dropped
        self._refusal_sent = False

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.registry.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse_and_close(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._refuse_and_close(400, f"malformed HTTP request ({exc})")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.registry.discard(self)
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.client_gone()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.watcher is not None:
            self.watcher.pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.watcher is not None:
            self.watcher.resume()

    # -- httptools callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._req = Request()
        self._body = []
        self._size = 0
        self._url = b""

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        req = self._req
        if name == b"authorization":
            req.auth = value
        elif name == b"x-request-id":
            req.request_id = value
        elif name == b"content-length":
            if value.strip().isdigit() and int(value) > self.max_body:
                req.too_large = True
        elif name == b"expect":
            req.expect_continue = value.strip().lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        req = self._req
        parser = self.parser
        req.method = parser.get_method()
        req.keep_alive = parser.should_keep_alive()
        req.http11 = parser.get_http_version() == "1.1"
        q = self._url.find(b"?")
        req.path = self._url if q < 0 else self._url[:q]
        if req.too_large:
            self._refuse_body()
        elif req.expect_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._discarded >= 0:
            self._discarded += len(body)
            if self._discarded > _DISCARD_CAP and self.transport is not None:
                self.transport.abort()
            return
        self._size += len(body)
        if self._size > self.max_body:
            self._req.too_large = True
            self._refuse_body()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._discarded >= 0:
            self._discarded = -1
            if self._refusal_sent:
                self._close_now()
            else:
                self.closing = True  # an earlier request is still answering; close after it
            return
        req = self._req
        body = self._body
        req.body = body[0] if len(body) == 1 else b"".join(body)
        if self.busy:
            self._pending.append(req)
            if len(self._pending) >= _MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()
            return
        self.busy = True
        self.handler.handle(self, req)

    # -- used by handlers -------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def respond(self, status: int, body: bytes, request_id: bytes, keep_alive: bool, *,
                content_type: bytes = responses.JSON, extra: bytes = b"") -> None:
        """Write a whole response and free the connection."""
        keep = keep_alive and not self.closing
        self.write(responses.head(status, request_id, keep, content_type=content_type,
                                  length=len(body), extra=extra) + body)
        self.finish(keep)

    def finish(self, keep_alive: bool) -> None:
        """The current response is complete; serve the next pipelined request or close."""
        self.busy = False
        self.watcher = None
        if not keep_alive or self.closing:
            self._close_now()
            return
        if self._pending:
            req = self._pending.popleft()
            if len(self._pending) == _MAX_PIPELINED - 1 and self.transport is not None:
                self.transport.resume_reading()
            self.busy = True
            self.handler.handle(self, req)

    def begin_close(self) -> None:
        """Shutdown: close now if idle, else after the response in progress."""
        self.closing = True
        if not self.busy:
            self._close_now()

    def _close_now(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()
        self.closed = True

    def _refuse_body(self) -> None:
        self._discarded = 0
        self._body = []
        self.handler.refused(413)
        self._refusal_sent = not self.busy
        if self.busy:
            return  # an earlier request is still answering; this one gets no reply
        self.busy = True
        self.write(responses.head(413, b"", False, length=len(_TOO_LARGE)) + _TOO_LARGE)
        self.closing = True

    def _refuse_and_close(self, status: int, message: str) -> None:
        self.handler.refused(status)
        body = responses.error_body(status, message)
        self.write(responses.head(status, b"", False, length=len(body)) + body)
        self._close_now()


_TOO_LARGE = responses.error_body(
    413, "request body exceeds the router's limit (serving.max_request_bytes in the fleet document)",
    code="request_too_large")
