"""The floor of a Python two-leg P/D router: the I/O alone, on the router's own building blocks.

    python bench/_floor_relay.py PREFILL_URL DECODE_URL PORT

router_overhead.py runs this next to the real routers as `floor`. It does, per streamed
completion, only what every two-leg router must: parse the client's request (httptools),
decode its JSON body (orjson), send the one-token prefill leg with `do_remote_decode`, read
and decode the producer's answer, send the decode leg with its `kv_transfer_params`, and
relay the engine's chunked SSE bytes to the client as they arrive, on uvloop, with keep-alive
connections on both sides. It has none of narwhal-serve's work: no scheduling, admission,
health, deadlines, retries, journal, metrics, request ids or error handling. It is not a
router anyone should run; it exists so that each run shows, beside the bar, the CPU per
request below which no router built on uvloop and Python callbacks can go on this machine.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson
import uvloop

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n")

Sink = Callable[["Upstream", bytes, bool], None]


def post(host: bytes, body: bytes) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: %b\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (host, len(body), body))


class Upstream(asyncio.Protocol):
    """One keep-alive connection to an engine; `sink(data, complete)` gets every read."""

    def __init__(self, idle: list[Upstream]) -> None:
        self.idle = idle
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.body: list[bytes] = []
        self.complete = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:  # the engine closed an idle keep-alive connection
            self.idle.remove(self)

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        self.complete = True

    def data_received(self, data: bytes) -> None:
        self.complete = False
        self.parser.feed_data(data)
        sink = self.sink
        if self.complete:
            self.sink = None
            self.idle.append(self)
        if sink is not None:
            sink(self, data, self.complete)

    def send(self, request: bytes, sink: Sink) -> None:
        self.body = []
        self.sink = sink
        self.transport.write(request)


class Pool:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.addr = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.host = parts.netloc.encode()
        self.idle: list[Upstream] = []

    def send(self, request: bytes, sink: Sink) -> None:
        if self.idle:
            self.idle.pop().send(request, sink)
        else:
            asyncio.get_running_loop().create_task(self._open_and_send(request, sink))

    async def _open_and_send(self, request: bytes, sink: Sink) -> None:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: Upstream(self.idle), *self.addr)
        conn.send(request, sink)


class Front(asyncio.Protocol):
    """A client connection: one streamed completion at a time, relayed over two legs."""

    def __init__(self, prefill: Pool, decode: Pool) -> None:
        self.prefill = prefill
        self.decode = decode
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.body = []

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        if self.parser.get_method() == b"GET":  # readiness, for the bench's start-up wait
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return
        request = orjson.loads(b"".join(self.body))
        leg = dict(request, max_tokens=1, stream=False,
                   kv_transfer_params={"do_remote_decode": True})

        def prefilled(conn: Upstream, data: bytes, complete: bool) -> None:
            if complete:
                answer = orjson.loads(b"".join(conn.body))
                self._decode(request, answer["kv_transfer_params"])

        self.prefill.send(post(self.prefill.host, orjson.dumps(leg)), prefilled)

    def _decode(self, request: dict[str, Any], kv: Any) -> None:
        transport = self.transport
        head_seen = False

        def relay(conn: Upstream, data: bytes, complete: bool) -> None:
            nonlocal head_seen
            if not head_seen:  # the engine's response head: drop it, send ours instead
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    return
                data = HEAD + data[end + 4:]
                head_seen = True
            transport.write(data)

        leg = dict(request, kv_transfer_params=kv)
        self.decode.send(post(self.decode.host, orjson.dumps(leg)), relay)


async def main(prefill_url: str, decode_url: str, port: int) -> None:
    prefill, decode = Pool(prefill_url), Pool(decode_url)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Front(prefill, decode), "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
