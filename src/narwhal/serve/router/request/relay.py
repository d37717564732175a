"""Sinks for the decode leg, one per kind of client.

- `PassRelay` (an HTTP/1.1 streaming client, the common case) forwards the engine's chunked
  SSE bytes as they arrive: one write per socket read, no parsing, no re-framing.
- `StreamRelay` (an HTTP/1.0 streaming client) strips the chunk framing and ends the body by
  closing the connection.
- `BufferRelay` (a non-streaming client) keeps the stream for reassembly into one body.

The client's response head goes out together with the first body byte, so until that moment
the leg can still be retried on another engine. A leg that breaks after that ends the stream
with an SSE error event. Each relay ends exactly once and then calls its `then` continuation
with itself; `result` says how it ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from narwhal.serve.router.front import responses
from narwhal.serve.router.request.upstream import UpstreamConnection

# Relay results
OK = "ok"
ENGINE_STATUS = "engine_status"  # the engine answered with a non-200 status (body kept)
FAILED_BEFORE = "failed_before"  # broke before any byte reached the client: retryable
FAILED_MID = "failed_mid"  # broke after the client saw bytes: stream ended with an error event
TIMEOUT_BEFORE = "timeout_before"
TIMEOUT_MID = "timeout_mid"
CLIENT_GONE = "client_gone"
CUT = "cut"  # the router is shutting down and the drain bound ran out
# The status a leg is given when the engine's 200 stream opens with an error event (vLLM's
# streamed answer to a KV load failure): no token reached the client, so it is an engine
# error like a 5xx, and another engine may answer.
ERROR_FIRST_STATUS = 502
_ERROR_EVENT = b'data: {"error"'


def opens_with_error(data: bytes) -> bool:
    """Whether a stream's first bytes (chunk framing or not) are an error event."""
    return data.find(_ERROR_EVENT, 0, 48) >= 0


# Forwarded bytes kept before they are folded into text (the common stream never reaches it).
FOLD_BYTES = 256 * 1024


class EventReader(Protocol):
    """Folds whole SSE events into what the client holds (continuation.Sent)."""

    def read(self, payload: bytes, chat: bool) -> None: ...


class SentBytes:
    """The engine bytes a relay forwarded to its client, kept until a failure needs them:
    one list append per read on the common path; past FOLD_BYTES they are folded into a
    reader (made by `make_reader` on the first fold) at the next read that ends on an event
    boundary, so a long stream keeps its text, not its framing (continuation.py reads them
    back)."""

    __slots__ = ("chat", "chunked", "make_reader", "parts", "reader", "size", "total")

    def __init__(self, chat: bool, chunked: bool,
                 make_reader: Callable[[], EventReader]) -> None:
        self.chat = chat
        self.chunked = chunked  # HTTP/1.1 chunks (else SSE text)
        self.parts: list[bytes] = []
        self.size = 0
        self.total = 0
        self.make_reader = make_reader
        self.reader: EventReader | None = None

    def add(self, data: bytes) -> None:
        self.parts.append(data)
        n = len(data)
        self.size += n
        self.total += n
        if self.size > FOLD_BYTES and data.endswith(b"\n\r\n" if self.chunked else b"\n\n"):
            self.fold()

    def fold(self) -> EventReader:
        """Fold what is kept into the reader (made now if it is the first fold); return it."""
        reader = self.reader
        if reader is None:
            reader = self.reader = self.make_reader()
        raw = b"".join(self.parts)
        self.parts.clear()
        self.size = 0
        reader.read(dechunk(raw) if self.chunked else raw, self.chat)
        return reader


class EventRewriter(Protocol):
    """Turns a continuing engine's SSE text into the client's (continuation.Rewriter)."""

    def feed(self, payload: bytes) -> bytes: ...


class ClientSide(Protocol):
    """The client connection a streaming relay writes to (front.ClientConnection)."""

    closed: bool
    transport: asyncio.Transport | None

    def write(self, data: bytes) -> None: ...


class DecodeRelay:
    """Common state of a decode-leg sink; subclasses decide where body bytes go."""

    __slots__ = ("body", "broken", "conn", "deadline", "error_first", "events", "idle_s", "log",
                 "reason", "result", "reused", "stall", "started", "status", "t_first", "t_last",
                 "then")

    def __init__(self, then: Callable[[DecodeRelay], None], first_byte_timeout_s: float,
                 idle_s: float) -> None:
        self.then = then
        self.deadline = time.monotonic() + first_byte_timeout_s
        self.idle_s = idle_s
        self.conn: UpstreamConnection | None = None
        self.status = 0
        self.body: list[bytes] = []
        self.started = False
        self.events = 0
        self.t_first = 0.0
        self.t_last = 0.0
        self.result = ""
        self.reason = ""
        self.reused = False
        self.log: SentBytes | None = None  # set when a broken stream may be continued
        self.broken: tuple[str, str] | None = None  # the error event a break owes the client
        self.error_first = False  # the engine's stream opened with an error event
        # asked when a streaming leg has been silent past `idle_s`: seconds more it is given
        # (0: it is stalled now); None: stalled at once
        self.stall: Callable[[DecodeRelay], float] | None = None

    def reusable(self) -> bool:
        """Whether the client connection may carry another request after this leg."""
        return True

    def _end(self, result: str, reason: str = "") -> None:
        if not self.result:
            self.result = result
            self.reason = reason
            self.then(self)

    def on_start(self, status: int) -> None:
        self.status = status

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def _error_first(self, data: bytes) -> bool:
        """A 200 stream whose first event is an error: kept, never sent (ERROR_FIRST_STATUS)."""
        if not self.started and self.status == 200 and opens_with_error(data):
            self.status = ERROR_FIRST_STATUS
            self.error_first = True
        return self.error_first

    def on_flush(self) -> None:
        if self.started:  # until the first body byte the first-byte deadline stands
            self.deadline = time.monotonic() + self.idle_s

    def on_complete(self) -> None:
        self._end(OK if self.status == 200 else ENGINE_STATUS)

    def _break_stream(self, message: str, code: str) -> None:
        """End a stream the client already receives with an error event (streaming sinks)."""

    def write_events(self, payload: bytes, end: bool) -> None:
        """Send SSE text to the client in this relay's framing (a continued stream's events;
        `end`: the response ends with them)."""
        self.body.append(payload)

    def clean(self) -> bool:
        """Whether the client's bytes end on a whole event (a stream can be continued)."""
        return True

    def owe_break(self) -> bool:
        """Write the error event a mid-stream break left owing (the stream is not being
        continued); False when the client's bytes ended mid-chunk and none can be added."""
        broken, self.broken = self.broken, None
        if broken is not None:
            self._break_stream(*broken)
        return self.reusable()

    def on_fail(self, reason: str, before_response: bool, reused: bool) -> None:
        if self.started and not self.result:
            self.broken = (f"decode engine failed mid-stream: {reason}", "engine_failed")
        self.reused = reused and before_response
        self._end(FAILED_MID if self.started else FAILED_BEFORE, reason)

    def expire(self) -> None:
        if self.t_first > 0.0 and not self.result and self.stall is not None:
            more = self.stall(self)
            if more > 0.0:
                self.deadline = time.monotonic() + more
                return
        if self.started and not self.result:
            silent = time.monotonic() - (self.t_last or self.t_first or time.monotonic())
            self.broken = (f"decode engine sent nothing for {silent:.3g} s", "engine_timeout")
        if self.conn is not None:
            self.conn.abandon()
        self._end(TIMEOUT_MID if self.started else TIMEOUT_BEFORE, "engine stopped sending")

    def client_gone(self) -> None:
        if self.conn is not None:
            self.conn.abandon()
        self._end(CLIENT_GONE, "client closed the connection")

    def cut(self) -> None:
        """Shutdown ran out of drain time: end the leg now."""
        if self.started and not self.result:
            self._break_stream("the router shut down before this stream ended; retry it",
                               "router_shutdown")
        if self.conn is not None:
            self.conn.abandon()
        self._end(CUT, "router shut down before the leg ended")

    def pause(self) -> None:
        if self.conn is not None:
            self.conn.pause()

    def resume(self) -> None:
        if self.conn is not None:
            self.conn.resume()


class BufferRelay(DecodeRelay):
    """Keeps the whole stream for reassembly into one JSON body. Nothing reaches the client
    until the leg ends, but a leg that already produced bytes is not retried: its KV was used."""

    __slots__ = ()

    def on_body(self, data: bytes) -> None:
        if self.status != 200 or (not self.started and self._error_first(data)):
            self.body.append(data)
            return
        if not self.started:
            self.started = True
            self.t_first = time.monotonic()
        # the tokens streamed so far, for the scheduler's projection of this stream's life
        # (an event a read boundary splits is missed: a token's error, not the journal's)
        self.events += data.count(b"data:")
        self.t_last = time.monotonic()
        self.body.append(data)

    def on_complete(self) -> None:
        self.t_last = time.monotonic()
        super().on_complete()


class StreamRelay(DecodeRelay):
    """Streams the engine's SSE bytes to the client as they arrive."""

    __slots__ = ("chunked", "client", "head", "out", "whole")

    def __init__(self, then: Callable[[DecodeRelay], None], first_byte_timeout_s: float,
                 idle_s: float, client: ClientSide, head: bytes, chunked: bool) -> None:
        super().__init__(then, first_byte_timeout_s, idle_s)
        self.client = client
        self.head = head
        self.chunked = chunked
        self.out: list[bytes] = []
        self.whole = True  # the client's bytes end on a whole event

    def clean(self) -> bool:
        return self.whole

    def reusable(self) -> bool:
        return self.chunked

    def on_body(self, data: bytes) -> None:
        if self.status != 200 or (not self.started and self._error_first(data)):
            self.body.append(data)
            return
        out = self.out
        if not self.started:
            self.started = True
            self.t_first = time.monotonic()
            out.append(self.head)
        self.events += data.count(b"data:")
        self.whole = data.endswith(b"\n\n")
        if self.log is not None:
            self.log.add(data)
        if self.chunked:
            out.append(b"%x\r\n" % len(data))
            out.append(data)
            out.append(b"\r\n")
        else:
            out.append(data)

    def write_events(self, payload: bytes, end: bool) -> None:
        if payload:
            self.out.append(b"%x\r\n%b\r\n" % (len(payload), payload) if self.chunked
                            else payload)
        if end and self.chunked:
            self.out.append(b"0\r\n\r\n")
        self.on_flush()

    def on_flush(self) -> None:
        if self.out:
            self.client.write(b"".join(self.out))
            self.out.clear()
            now = time.monotonic()
            self.t_last = now
            self.deadline = now + self.idle_s
        elif self.started:
            self.deadline = time.monotonic() + self.idle_s

    def on_complete(self) -> None:
        if self.status == 200:
            if not self.started:
                self.started = True
                self.t_first = time.monotonic()
                self.out.append(self.head)
            if self.chunked:
                self.out.append(b"0\r\n\r\n")
            self.on_flush()
        super().on_complete()

    def _break_stream(self, message: str, code: str) -> None:
        event = responses.sse_error_event(message, code)
        if self.chunked:
            self.out.append(b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event))
        else:
            self.out.append(event)
        self.on_flush()


def dechunk(raw: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body (rare path: engine errors in raw mode)."""
    out: list[bytes] = []
    pos = 0
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            return b"".join(out)
        size = int(raw[pos:eol].split(b";", 1)[0] or b"0", 16)
        if size == 0:
            return b"".join(out)
        out.append(raw[eol + 2:eol + 2 + size])
        pos = eol + 2 + size + 2


# The last SSE event of an OpenAI stream, as one HTTP chunk. The engine sends its chunked
# body's terminator right behind it (often in a separate segment).
_DONE_CHUNK = b"data: [DONE]\n\n\r\n"


class PassRelay(DecodeRelay):
    """Streams the engine's chunked SSE body to an HTTP/1.1 client byte for byte.

    The engine's chunk framing is kept, so a socket read costs one Python call and one write:
    no per-chunk callback, no re-framing. The connection's C parser still tracks the framing
    and says when the body ended. A break after bytes went out is repaired with an error event
    when the forwarded bytes end on a chunk boundary (an SSE event ends in a blank line, the
    chunk in CRLF: `\\n\\r\\n`); otherwise the client connection is closed mid-body, which an
    HTTP client reports as a truncated response.

    A read that ends with the `[DONE]` chunk (or a continuation's events written through
    `write_events` that end with it) is held until the terminator behind it arrives,
    so the stream's end costs the client one write (and one wakeup) instead of two; nothing a
    client can act on waits, since `[DONE]` carries no token and the response is not complete
    without the terminator. A leg that breaks first flushes what it held before its error event.
    """

    __slots__ = ("client", "edge", "framed", "head", "held", "pending_head", "tail", "torn")

    def __init__(self, then: Callable[[DecodeRelay], None], first_byte_timeout_s: float,
                 idle_s: float, client: ClientSide, head: bytes) -> None:
        super().__init__(then, first_byte_timeout_s, idle_s)
        self.client = client
        self.head = head
        self.pending_head: bytes | None = b""  # engine response head not yet seen in full
        self.framed = True  # the engine's body is chunked (else it is re-framed here)
        self.tail = b""
        self.torn = False
        self.held = b""  # client bytes waiting for the engine's terminator (see above)
        self.edge = b""  # the engine's last 4 bytes, to count an event marker split by a read

    def reusable(self) -> bool:
        return not self.torn

    def on_raw(self, data: bytes, complete: bool) -> None:
        if self.pending_head is not None:
            buf = self.pending_head + data if self.pending_head else data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.pending_head = buf
                return
            self.framed = b"transfer-encoding: chunked" in buf[:end].lower()
            self.pending_head = None
            data = buf[end + 4:]
        if self.status != 200 or (not self.started and data and self._error_first(data)):
            self.body.append(data)
            if complete:
                if self.framed:
                    self.body = [dechunk(b"".join(self.body))]
                self._end(ENGINE_STATUS)
            return
        now = time.monotonic()
        if data:
            # `edge` (4 bytes before the read, 4 into it) holds no whole "data:" of either
            # side, only one that a read boundary split: each event is counted exactly once
            edge = self.edge + data[:4]
            self.edge = data[-4:] if len(data) > 3 else edge[-4:]
            self.events += data.count(b"data:") + edge.count(b"data:")
            if not self.framed:
                data = b"%x\r\n%b\r\n" % (len(data), data)
            if self.log is not None:
                self.log.add(data)
            if not self.started:
                self.started = True
                self.t_first = now
                data = self.head + data
            if self.held:
                data = self.held + data
                self.held = b""
            self.tail = data[-3:] if len(data) > 2 else (self.tail + data)[-3:]
            self.t_last = now
            self.deadline = now + self.idle_s  # the head alone does not count as a first byte
            if not complete:
                if self.framed and data.endswith(_DONE_CHUNK):
                    self.held = data
                else:  # self._send(data), inlined: this is the per-read path
                    client = self.client
                    if not client.closed and client.transport is not None:
                        client.transport.write(data)
        elif complete and self.held:
            data, self.held = self.held, b""
        if complete:
            if not self.started:
                self.started = True
                self.t_first = now
                data = self.head + (b"" if self.framed else b"0\r\n\r\n")
            elif not self.framed:
                data += b"0\r\n\r\n"
            if data:
                self._send(data)
            self._end(OK)

    def _send(self, data: bytes) -> None:
        client = self.client
        if not client.closed and client.transport is not None:
            client.transport.write(data)

    def client_gone(self) -> None:
        self.held = b""
        super().client_gone()

    def clean(self) -> bool:
        return self.tail == b"\n\r\n"

    def write_events(self, payload: bytes, end: bool) -> None:
        held, self.held = self.held, b""
        out = held + (b"%x\r\n%b\r\n" % (len(payload), payload) if payload else b"")
        if end:
            out += b"0\r\n\r\n"
        elif out.endswith(_DONE_CHUNK):  # a continuation's [DONE] waits for the end too
            self.held = out
            return
        if out:
            self._send(out)

    def _break_stream(self, message: str, code: str) -> None:
        held, self.held = self.held, b""
        if self.tail != b"\n\r\n":
            self.torn = True  # mid-chunk: no clean way to add an event
            return
        event = responses.sse_error_event(message, code)
        self._send(held + b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event))


class ContinueRelay(DecodeRelay):
    """The leg that continues a broken stream on another engine: the client already has the
    response head and part of the answer, so every end of this leg is mid-stream, an engine
    status other than 200 included; the engine's events are rewritten (`EventRewriter`) and
    written through the relay that began the response (`sink`, for its framing)."""

    __slots__ = ("rewriter", "sink")

    def __init__(self, then: Callable[[DecodeRelay], None], first_byte_timeout_s: float,
                 idle_s: float, sink: DecodeRelay, rewriter: EventRewriter) -> None:
        super().__init__(then, first_byte_timeout_s, idle_s)
        self.sink = sink
        self.rewriter = rewriter
        self.started = True
        self.body = sink.body  # a buffered reply is reassembled from both legs' events

    def reusable(self) -> bool:
        return self.sink.reusable()

    def clean(self) -> bool:
        return True  # it writes whole events only

    def on_start(self, status: int) -> None:
        self.status = status

    def on_body(self, data: bytes) -> None:
        if not self.t_first and self.status == 200 and opens_with_error(data):
            self.status = ERROR_FIRST_STATUS  # it failed before its first token
        if self.status != 200:  # kept for the reason only: the reply never carries it
            if len(self.reason) < 512:
                self.reason += data[:512].decode("utf-8", "replace")
            return
        if not self.t_first:
            self.t_first = time.monotonic()
        out = self.rewriter.feed(data)
        if out:
            self.events += out.count(b"data:")  # the events the client gets, as they go
            self.sink.write_events(out, False)
            self.t_last = time.monotonic()

    def on_flush(self) -> None:
        if self.t_first:
            self.deadline = time.monotonic() + self.idle_s

    def on_complete(self) -> None:
        if self.status != 200:
            reason = f"continuing engine answered {self.status}: {self.reason}"
            self.broken = (reason, "engine_failed")
            self._end(FAILED_MID, reason)
            return
        self.t_last = time.monotonic()
        self.sink.write_events(b"", True)
        self._end(OK)

    def _break_stream(self, message: str, code: str) -> None:
        self.sink._break_stream(message, code)

    def write_events(self, payload: bytes, end: bool) -> None:
        self.sink.write_events(payload, end)
