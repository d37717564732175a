"""Pooled keep-alive HTTP/1.1 connections from the router to one engine.

The hot path is callback-driven: httptools parses the engine's response in C and hands each
body piece to a `LegSink` (a prefill collector, a stream relay, a health probe). No per-chunk
task, queue or await sits between the engine's socket and the client's. The connection is
opened through a `Connector`, the one seam to the network, so a test or a fault injector can
stand behind it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import httptools

Connector = Callable[
    [Callable[[], asyncio.Protocol], str, int],
    Awaitable[tuple[asyncio.BaseTransport, asyncio.Protocol]],
]


class EngineUnreachable(Exception):
    """A new connection to the engine could not be opened."""


class LegSink(Protocol):
    """Receives one engine response, piece by piece, on the event loop."""

    def on_start(self, status: int) -> None: ...

    def on_body(self, data: bytes) -> None: ...

    def on_flush(self) -> None:
        """Called once after each socket read, so writes to the client can be batched."""

    def on_complete(self) -> None: ...

    def on_fail(self, reason: str, before_response: bool, reused: bool) -> None: ...


class RawSink(Protocol):
    """Receives one engine response as the bytes that arrived (head included), one call per
    socket read: no Python call per HTTP chunk. Used to pass a chunked SSE body through."""

    def on_start(self, status: int) -> None: ...

    def on_raw(self, data: bytes, complete: bool) -> None: ...

    def on_fail(self, reason: str, before_response: bool, reused: bool) -> None: ...


class _MessageEvents:
    """httptools callbacks for raw mode: the two message-level events only, so the C parser
    tracks framing without calling back into Python for every chunk."""

    __slots__ = ("conn",)

    def __init__(self, conn: UpstreamConnection) -> None:
        self.conn = conn

    def on_headers_complete(self) -> None:
        self.conn.raw_headers_complete()

    def on_message_complete(self) -> None:
        self.conn.raw_complete = True


class UpstreamConnection(asyncio.Protocol):
    """One TCP connection to an engine; carries one request at a time."""

    __slots__ = ("_keep", "_raw_parser", "closed", "got_bytes", "idle_since", "parser", "pool",
                 "raw_complete", "raw_sink", "reused", "sink", "transport")

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: LegSink | None = None
        self.reused = False
        self.got_bytes = False
        self.closed = False
        self.idle_since = 0.0
        self._keep = True
        self.raw_sink: RawSink | None = None
        self.raw_complete = False
        self._raw_parser: httptools.HttpResponseParser | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        raw = self.raw_sink
        if raw is not None:  # the stream path: one call per read, inlined on purpose
            self.raw_complete = False
            try:
                self._raw_parser.feed_data(data)  # type: ignore[union-attr]
            except httptools.HttpParserError as exc:
                self.fail(f"engine sent malformed HTTP ({exc})")
                return
            complete = self.raw_complete
            if complete:
                self.raw_sink = None
                if self._keep:
                    self.pool.release(self)
                else:
                    self.close()
            raw.on_raw(data, complete)
            return
        sink = self.sink
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(f"engine sent malformed HTTP ({exc})")
            return
        if sink is not None:
            sink.on_flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        sink, self.sink = self.sink, None
        raw, self.raw_sink = self.raw_sink, None
        for s in (sink, raw):
            if s is not None:
                s.on_fail("engine closed the connection", not self.got_bytes, self.reused)

    # -- raw mode ---------------------------------------------------------------------------
    def raw_headers_complete(self) -> None:
        parser = self._raw_parser
        assert parser is not None
        self._keep = parser.should_keep_alive()
        if self.raw_sink is not None:
            self.raw_sink.on_start(parser.get_status_code())

    # -- httptools callbacks ----------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self._keep = self.parser.should_keep_alive()
        if self.sink is not None:
            self.sink.on_start(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.on_body(body)

    def on_message_complete(self) -> None:
        sink, self.sink = self.sink, None
        if self._keep:
            self.pool.release(self)
        else:
            self.close()
        if sink is not None:
            sink.on_complete()

    # -- used by legs -----------------------------------------------------------------------
    def send(self, data: bytes, sink: LegSink) -> None:
        self.sink = sink
        self.got_bytes = False
        assert self.transport is not None
        self.transport.write(data)

    def send_raw(self, data: bytes, sink: RawSink) -> None:
        """Send a request whose response goes to `sink` as raw bytes (see RawSink)."""
        if self._raw_parser is None:
            self._raw_parser = httptools.HttpResponseParser(_MessageEvents(self))
        self.raw_sink = sink
        self.got_bytes = False
        assert self.transport is not None
        self.transport.write(data)

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()

    def abandon(self) -> None:
        """Drop the connection mid-response (timeout, client gone): it cannot be reused."""
        self.sink = None
        self.raw_sink = None
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def fail(self, reason: str) -> None:
        """Drop the connection and tell the leg on it why."""
        sinks = (self.sink, self.raw_sink)
        self.abandon()
        for sink in sinks:
            if sink is not None:
                sink.on_fail(reason, False, self.reused)


async def _default_connector(
    factory: Callable[[], asyncio.Protocol], host: str, port: int
) -> tuple[asyncio.BaseTransport, asyncio.Protocol]:
    return await asyncio.get_running_loop().create_connection(factory, host, port)


class EnginePool:
    """Idle keep-alive connections to one engine, newest first."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float,
        keepalive_s: float,
        max_idle: int = 256,
        connector: Connector | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle
        self._connector = connector or _default_connector
        self._idle: list[UpstreamConnection] = []
        self._all: set[UpstreamConnection] = set()

    def take(self) -> UpstreamConnection | None:
        """A warm idle connection if one is fresh enough (the common case: no await)."""
        idle = self._idle
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < self.keepalive_s:
                    conn.reused = True
                    return conn
                conn.close()
        return None

    async def acquire(self) -> UpstreamConnection:
        """A warm idle connection, else a new one."""
        return self.take() or await self.connect()

    async def connect(self) -> UpstreamConnection:
        """A new connection; raises EngineUnreachable."""
        try:
            _, proto = await asyncio.wait_for(
                self._connector(lambda: UpstreamConnection(self), self.host, self.port),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise EngineUnreachable(f"connect timed out after {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise EngineUnreachable(exc.strerror or str(exc)) from None
        assert isinstance(proto, UpstreamConnection)
        self._all.add(proto)
        return proto

    def release(self, conn: UpstreamConnection) -> None:
        if conn.closed or len(self._idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def close_all(self) -> None:
        for conn in list(self._all):
            conn.fail("router is shutting down")
        self._idle.clear()
