"""Sending a leg to an engine, and collecting a whole response (prefill legs, /tokenize, probes).

A leg is a sink object handed to an upstream connection; when the response ends, fails or
times out, the sink calls its `then` continuation exactly once, directly from the socket
callback: no task and no future per leg on the request path. `dispatch` sends on a warm idle
connection at once and opens a new connection in the background only when none is idle.

A keep-alive connection the engine closed while it sat idle fails before any response byte
(`before_response` and `reused`); the engine never saw the request, so callers resend it once
on a fresh connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from narwhal.serve.router.request.deadlines import Deadlines
from narwhal.serve.router.request.upstream import EnginePool, EngineUnreachable, UpstreamConnection

OK = "ok"
FAILED = "failed"
TIMEOUT = "timeout"

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class LegFailed(Exception):
    """The engine connection broke during an exchange."""

    def __init__(self, reason: str, before_response: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.before_response = before_response


class LegTimedOut(Exception):
    """The engine did not answer within the leg's deadline."""


def request_bytes(method: bytes, path: bytes, host: bytes, request_id: bytes,
                  body: bytes | None, bearer: bytes = b"") -> bytes:
    """An HTTP/1.1 request with only the headers an engine needs."""
    head = b"%b %b HTTP/1.1\r\nhost: %b\r\n" % (method, path, host)
    if request_id:
        head += b"x-request-id: %b\r\n" % request_id
    if bearer:
        head += b"authorization: Bearer %b\r\n" % bearer
    if body is None:
        return head + b"\r\n"
    return head + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b" % (
        len(body), body)


class Collector:
    """A sink that keeps the whole response body, then calls `then(self)` once."""

    __slots__ = ("before_response", "body", "conn", "deadline", "reason", "result", "reused",
                 "status", "then")

    def __init__(self, then: Callable[[Collector], None], deadline: float) -> None:
        self.then = then
        self.deadline = deadline
        self.status = 0
        self.body: list[bytes] = []
        self.conn: UpstreamConnection | None = None
        self.result = ""
        self.reason = ""
        self.before_response = False
        self.reused = False

    def _end(self, result: str) -> None:
        if not self.result:
            self.result = result
            self.then(self)

    @property
    def stale_keepalive(self) -> bool:
        """Failed on a reused connection before any response byte: safe to resend."""
        return self.result == FAILED and self.before_response and self.reused

    def on_start(self, status: int) -> None:
        self.status = status

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_flush(self) -> None:
        pass

    def on_complete(self) -> None:
        self._end(OK)

    def on_fail(self, reason: str, before_response: bool, reused: bool) -> None:
        self.reason = reason
        self.before_response = before_response
        self.reused = reused
        self._end(FAILED)

    def expire(self) -> None:
        if self.conn is not None:
            self.conn.abandon()
        self.reason = "no answer before the deadline"
        self._end(TIMEOUT)


def _go(conn: UpstreamConnection, request: bytes, sink: Any, raw: bool) -> None:
    """Send on `conn`; `sink` is a Collector or a decode relay (it has conn, result, on_fail)."""
    if sink.result:  # ended (timed out, cut) while the connection was being opened
        conn.pool.release(conn)
        return
    sink.conn = conn
    if raw:
        conn.send_raw(request, sink)
    else:
        conn.send(request, sink)


async def _connect_and_go(pool: EnginePool, request: bytes, sink: Any, raw: bool) -> None:
    try:
        conn = await pool.connect()
    except EngineUnreachable as exc:
        sink.on_fail(str(exc), True, False)
        return
    _go(conn, request, sink, raw)


def dispatch(pool: EnginePool, request: bytes, sink: Any, deadlines: Deadlines, spawn: Spawn, *,
             raw: bool = False, fresh: bool = False) -> None:
    """Send `request` with `sink` receiving the response; the sink's deadline starts now."""
    deadlines.add(sink)
    conn = None if fresh else pool.take()
    if conn is not None:
        _go(conn, request, sink, raw)
    else:
        spawn(_connect_and_go(pool, request, sink, raw))


async def exchange(pool: EnginePool, request: bytes, timeout_s: float,
                   deadlines: Deadlines) -> tuple[int, bytes]:
    """Send one request and return (status, body), for paths that may await (probes,
    /tokenize). Raises EngineUnreachable, LegFailed, LegTimedOut."""
    loop = asyncio.get_running_loop()
    for attempt in (0, 1):
        done: asyncio.Future[None] = loop.create_future()

        def wake(_sink: Collector, fut: asyncio.Future[None] = done) -> None:
            if not fut.done():
                fut.set_result(None)

        sink = Collector(wake, time.monotonic() + timeout_s)
        conn = await (pool.connect() if attempt else pool.acquire())
        deadlines.add(sink)
        _go(conn, request, sink, False)
        try:
            await done
        finally:
            deadlines.discard(sink)
        if sink.result == TIMEOUT:
            raise LegTimedOut()
        if sink.result == FAILED:
            if sink.stale_keepalive and attempt == 0:
                continue
            raise LegFailed(sink.reason, sink.before_response)
        return sink.status, b"".join(sink.body)
    raise AssertionError("unreachable")  # pragma: no cover
