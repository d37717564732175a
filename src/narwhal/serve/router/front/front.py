"""The client-facing HTTP/1.1 server: a small asyncio protocol over httptools' C parser.

It keeps only the headers the router acts on (authorization, x-request-id, content-length,
expect) and serves one request at a time per connection: pipelined requests wait in a short
queue. Whoever answers a request calls `finish()` once, which frees the connection for the next.

Nothing a client sends is held without a bound (docs/security.md). A request head is buffered
here until its blank line arrives and handed to the parser in one piece: httptools joins a
header value that arrives in many reads by concatenation, which costs the square of its length,
so a head is never fed piecemeal, and one longer than `max_header_bytes` is refused (431, or
414 for the request line) before it is kept. The header count, the body (413 while it
arrives) and how long a head, a body or an idle keep-alive may take are bounded too; the
timeouts and the connection cap live in connections.py. A refusal for a pipelined request is
written after the responses ahead of it, then the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Protocol, cast

import httptools

from narwhal.serve.router.front import responses
from narwhal.serve.router.settings import ClientLimits

_log = logging.getLogger("narwhal.serve.router.front.front")
_MAX_PIPELINED = 16
_DISCARD_CAP = 64 * 1_048_576
_LINGER_S = 2.0  # after a refusal: read and drop for this long, so the reply is not reset
_LINGER_CAP = 1_048_576  # ... or until this much more arrived
_END = b"\r\n\r\n"


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


class Registry(Protocol):
    """Every open connection (connections.py): admits or refuses new ones, forgets closed ones."""

    def admit(self, conn: ClientConnection) -> None: ...

    def forget(self, conn: ClientConnection) -> None: ...


class Watcher(Protocol):
    """The in-flight call on a connection, told when the client goes away or pushes back."""

    def client_gone(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class _Refusal(Exception):
    """Raised from a parser callback to stop parsing and answer with this status."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ClientConnection(asyncio.Protocol):
    """One client TCP connection."""

    __slots__ = ("_body", "_deferred", "_discarded", "_head", "_header_bytes", "_headers",
                 "_in_head", "_pending", "_refusal_sent", "_req", "_size", "_stopped", "_tail",
                 "_url", "body_since", "busy", "closed", "closing", "handler", "idle_since", "limits",
                 "linger_until", "parser", "peer", "reading_since", "registry", "served",
                 "transport", "watcher", "write_paused")

    def __init__(self, handler: Handler, limits: ClientLimits, registry: Registry) -> None:
        self.handler = handler
        self.limits = limits
        self.registry = registry
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.busy = False
        self.closed = False
        self.closing = False
        self.write_paused = False
        self.watcher: Watcher | None = None
        self.served = 0
        self.idle_since = time.monotonic()  # since the last response ended (or the connect)
        self.reading_since = 0.0  # when the request being read began; 0 when none is
        self.body_since = 0.0  # when that request's head ended (its body's clock)
        self._pending: deque[Request] = deque()
        self._req = Request()
        self._body: list[bytes] = []
        self._size = 0
        self._url = b""
        self._in_head = True  # the next bytes belong to a request head
        self._head = bytearray()  # a head not yet handed to the parser
        self._tail = b""  # the last bytes the parser got, for a blank line split across reads
        self._header_bytes = 0
        self._headers = 0
        self._discarded = -1  # >= 0 while a refused body is being read and dropped
        self._refusal_sent = False
        self._deferred = b""  # a refusal to write once the responses ahead of it are done
        self._stopped = False  # the parser gave up on this stream: drop what follows
        self.linger_until = 0.0  # a refusal was sent: abort at this instant (connections.py)

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.registry.admit(self)

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            self._discarded += len(data)
            if self._discarded > _LINGER_CAP and self.transport is not None:
                self.transport.abort()
            return
        if self._in_head:
            data = self._whole_head(data)
            if not data:
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported", "upgrade_not_supported")
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refusal):
                self._refuse(cause.status, str(cause), cause.code)
            else:
                _log.error("client %s: parser callback failed (this is a bug)", self.peer,
                           exc_info=cause or exc)
                self._refuse(500, "router error while reading the request", "router_error")
            return
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request ({exc})", "malformed_request")
            return
        self._tail = data[-3:] if self._in_head else b""

    def _whole_head(self, data: bytes) -> bytes:
        """What to feed the parser now: `data` itself when the head it starts ends in it (the
        common case, no copy), the buffered head once its blank line arrived, else b"" (kept
        for the next read, or refused over the limit)."""
        head = self._head
        limit = self.limits.max_header_bytes
        if not head:
            if not self.reading_since:
                self.reading_since = time.monotonic()
            if self._tail and _END in self._tail + data[:3]:
                return data  # the parser already has the first part of the blank line
            end = data.find(_END, 0, limit + 1)
            if end >= 0 and end + 4 <= limit:
                return data
            head += data
            if end >= 0 or len(head) > limit:
                self._refuse_head()
            return b""
        start = len(head)
        head += data
        end = head.find(_END, start - 3 if start > 3 else 0)
        if (end < 0 and len(head) > limit) or end + 4 > limit:
            self._refuse_head()
            return b""
        if end < 0:
            return b""
        whole = bytes(head)
        head.clear()
        return whole

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.registry.forget(self)
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
        self._header_bytes = 0
        self._headers = 0
        if not self.reading_since:
            self.reading_since = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url  # at most two pieces: the head reaches the parser whole
        if len(self._url) > self.limits.max_request_line_bytes:
            raise _Refusal(414, _LINE_TOO_LONG, "request_line_too_long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._headers > self.limits.max_header_count:
            raise _Refusal(431, _TOO_MANY_HEADERS, "too_many_headers")
        if self._header_bytes > self.limits.max_header_bytes:
            raise _Refusal(431, _HEAD_TOO_LARGE, "headers_too_large")
        name = name.lower()
        req = self._req
        if name == b"authorization":
            req.auth = value
        elif name == b"x-request-id":
            req.request_id = value
        elif name == b"content-length":
            if value.strip().isdigit() and int(value) > self.limits.max_body_bytes:
                req.too_large = True
        elif name == b"expect":
            req.expect_continue = value.strip().lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        self._in_head = False
        self.body_since = time.monotonic()
        req = self._req
        parser = self.parser
        if parser.should_upgrade():
            raise _Refusal(400, "protocol upgrades are not supported", "upgrade_not_supported")
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
        if self._size > self.limits.max_body_bytes:
            self._req.too_large = True
            self._refuse_body()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_head = True
        self.reading_since = 0.0
        if self._discarded >= 0:
            self._discarded = -1
            self._stop_reading()
            if self._refusal_sent:
                self._linger(b"")  # the 413 is written; end our side and drop what follows
            return
        req = self._req
        body = self._body
        req.body = body[0] if len(body) == 1 else b"".join(body)
        if self.busy:
            self._pending.append(req)
            if len(self._pending) >= _MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()
            return
        self._dispatch(req)

    # -- used by handlers -------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def respond(self, status: int, body: bytes, request_id: bytes, keep_alive: bool, *,
                content_type: bytes = responses.JSON, extra: bytes = b"") -> None:
        """Write a whole response and free the connection. A refusal deferred behind it does
        not end it: the pipelined requests between them are answered first (`finish`)."""
        keep = keep_alive and not self.closing
        self.write(responses.head(status, request_id, keep, content_type=content_type,
                                  length=len(body), extra=extra) + body)
        self.finish(keep)

    def finish(self, keep_alive: bool) -> None:
        """The current response is complete; serve the next pipelined request or close."""
        self.busy = False
        self.watcher = None
        self.served += 1
        if keep_alive and not self.closing and self._pending:
            req = self._pending.popleft()
            if len(self._pending) == _MAX_PIPELINED - 1 and self.transport is not None:
                self.transport.resume_reading()
            self._dispatch(req)
            return
        if self._deferred:
            reply, self._deferred = self._deferred, b""
            self._linger(reply)
            return
        if not keep_alive or self.closing:
            self._close_now()
            return
        self.idle_since = time.monotonic()

    def begin_close(self) -> None:
        """Shutdown: close now if idle, else after the response in progress."""
        self.closing = True
        if not self.busy:
            self._close_now()

    # -- used by the registry (connections.py) ----------------------------------------------
    @property
    def parser_in_head(self) -> bool:
        """The request being read has not finished its head yet."""
        return self._in_head

    def evict(self) -> None:
        """Make room for a newer connection: this one is the idlest of its peer or of all."""
        self._close_now(abort=self.reading_since > 0 or self.linger_until > 0)

    def expire(self, status: int, message: str) -> None:
        """A head or body took too long (408), or a keep-alive sat idle (status 0: no reply)."""
        if status and self.busy and not self._refusal_sent:
            self._refuse(status, message, "request_timeout")  # after the response in progress
            return
        if status:
            self.handler.refused(status)
            body = responses.error_body(status, message, code="request_timeout")
            self._stop_reading()
            self._linger(responses.head(status, b"", False, length=len(body)) + body)
            return
        self._close_now()

    def refuse_connection(self, message: str, linger: bool) -> None:
        """Every slot is busy answering: this new connection gets a 503 and is closed. With
        `linger` (the registry has room to hold it a moment), the close waits for the client
        as any refusal does, so a request it already sent does not turn the 503 into a reset."""
        self.handler.refused(503)
        body = responses.error_body(503, message, code="too_many_connections")
        reply = responses.head(503, b"", False, length=len(body),
                               extra=b"retry-after: 1\r\n") + body
        if not linger:
            self.write(reply)
            self._close_now()
            return
        self._stop_reading()
        self._linger(reply)

    # -- internals --------------------------------------------------------------------------
    def _dispatch(self, req: Request) -> None:
        self.busy = True
        try:
            self.handler.handle(self, req)
        except Exception:  # a bug in a route: answer it, log it, keep the router serving
            _log.exception("client %s: %s %s failed (this is a bug)", self.peer,
                           req.method.decode("latin-1"), req.path[:200].decode("latin-1"))
            if self.busy and not self.closed:
                body = responses.error_body(500, "router error", code="router_error")
                self.write(responses.head(500, b"", False, length=len(body)) + body)
                self._stop_reading()
                self._close_now()

    def _close_now(self, abort: bool = False) -> None:
        if not self.closed and self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()
        self.closed = True

    def _stop_reading(self) -> None:
        """Nothing after a refused request is parsed: it is dropped as it arrives (while a
        response ahead of the refusal is still being written, the kernel holds it)."""
        self._stopped = True
        self.reading_since = 0.0
        self._discarded = 0
        self._head.clear()
        if self.busy and self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def _linger(self, reply: bytes) -> None:
        """Write a refusal and end our side, then drop input until the client closes or
        `_LINGER_S` passes: closing a socket with unread input resets it, and the reset can
        destroy the reply before the client reads it."""
        transport = self.transport
        if transport is None or self.closed:
            return
        if reply:
            transport.write(reply)
        if not transport.can_write_eof():
            self._close_now()
            return
        transport.write_eof()
        transport.resume_reading()
        self.closing = True
        self.linger_until = time.monotonic() + _LINGER_S
    def _refuse_head(self) -> None:
        head = self._head
        line = head.find(b"\r\n", 0, self.limits.max_request_line_bytes + 2)
        if line < 0 and len(head) > self.limits.max_request_line_bytes:
            self._refuse(414, _LINE_TOO_LONG, "request_line_too_long")
        else:
            self._refuse(431, _HEAD_TOO_LARGE, "headers_too_large")

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer a request the parser could not take, then close; after the responses ahead."""
        self.handler.refused(status)
        body = responses.error_body(status, message, code=code)
        reply = responses.head(status, b"", False, length=len(body)) + body
        self._stop_reading()
        if self.busy:
            self._deferred = reply
            return
        self._linger(reply)

    def _refuse_body(self) -> None:
        self._discarded = 0
        self._body = []
        self.handler.refused(413)
        reply = responses.head(413, b"", False, length=len(_TOO_LARGE)) + _TOO_LARGE
        if self.busy:  # an earlier request is still answering: the 413 follows its response
            self._deferred = reply
            self._refusal_sent = False
            return
        self._refusal_sent = True
        self.busy = True
        self.write(reply)
        self.closing = True


_TOO_LARGE = responses.error_body(
    413, "request body exceeds the router's limit (serving.max_request_bytes in the fleet document)",
    code="request_too_large")
_LINE_TOO_LONG = ("request line exceeds the router's limit (serving.max_request_line_bytes in "
                  "the fleet document)")
_HEAD_TOO_LARGE = ("request headers exceed the router's limit (serving.max_header_bytes in the "
                   "fleet document)")
_TOO_MANY_HEADERS = ("request has more headers than the router's limit (serving.max_header_count "
                     "in the fleet document)")
