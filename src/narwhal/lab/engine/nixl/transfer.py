"""Moving KV bytes: the producer's block server and the consumer's read-then-notify.

Real NIXL reads remote memory over UCX; the emulator reads over one TCP connection per pull on
the side-channel host (the fabric address in the lab), so a shaped link shows up in handoff
time. The producer streams memoryview slices of one preallocated buffer: no pull allocates
its payload, and eight engines stay small. Protocol (control frames from frames.py):

    consumer -> {"op": "read", "req", "blocks", "nbytes", "incarnation"}
    producer -> {"ok": true, "nbytes"} + nbytes raw bytes | {"ok": false, "error": <kind>}
    consumer -> {"op": "notif", "req"}     (vLLM's send_notif after the read, or alone to
                                            release the blocks of a request that failed)
    producer -> {"ok": true, "freed": bool}

Error kinds: "stale" (the reader's incarnation is not the agent's current one), "expired",
"unknown", "blocks" (ids not held for that request), "size" (over MAX_READ_BYTES).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from narwhal.lab.engine.nixl import frames
from narwhal.lab.engine.nixl.leases import LeaseTable
from narwhal.lab.engine.nixl.wire import AgentBlob

CHUNK = 1 << 20  # bytes per write/read; also the size of the producer's one send buffer
MAX_READ_BYTES = 1 << 40  # sanity bound on one request's read
CONNECT_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 60.0  # no byte for this long on an open read: the peer is treated as gone


class TransferError(Exception):
    """A read or notification failed; `kind` is "disconnect", "notify" or a server error kind."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True)
class ReadResult:
    bytes_moved: int
    seconds: float  # from issuing the read to the last byte
    post_seconds: float  # connecting and sending the read request


async def bind_address(host: str) -> str:
    """The one address a host name binds to (IPv4 first): 'localhost' must not become two ports."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    if not infos:
        raise RuntimeError(f"side channel host {host!r} does not resolve")
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


class BlockServer:
    """The producer end: serves leased blocks to readers that present the current incarnation."""

    def __init__(self, leases: LeaseTable, incarnation: Callable[[], str],
                 log: logging.Logger) -> None:
        self._leases = leases
        self._incarnation = incarnation
        self._log = log
        self._buffer = memoryview(bytes(range(256)) * (CHUNK // 256))
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[Any]] = set()
        self.address = ""
        self.port = 0

    async def start(self, host: str) -> None:
        self.address = await bind_address(host)
        self._server = await asyncio.start_server(self._client, self.address, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._clients):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _client(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            while (message := await frames.read(reader)) is not None:
                if message.get("op") == "read":
                    await self._read(message, writer)
                elif message.get("op") == "notif":
                    freed = self._leases.notified(str(message.get("req")))
                    writer.write(frames.encode({"ok": True, "freed": freed}))
                    await writer.drain()
                else:
                    raise frames.FrameError(f"unknown op {message.get('op')!r}")
        except Exception as exc:  # a bad client must never reach the event loop's handler
            self._log.debug("block server dropped a connection: %s: %s", type(exc).__name__, exc)
        finally:
            if task is not None:
                self._clients.discard(task)
            writer.close()

    def _refusal(self, message: dict[str, Any]) -> str | None:
        if message.get("incarnation") != self._incarnation():
            return "stale"
        request_id = str(message.get("req"))
        state = self._leases.state(request_id)
        if state != "held":
            return state
        lease = self._leases.get(request_id)
        held = {b for group in lease.block_ids for b in group} if lease else set()
        wanted = message.get("blocks")
        if not isinstance(wanted, list) or not all(
                isinstance(g, list) and all(b in held for b in g) for g in wanted):
            return "blocks"
        nbytes = message.get("nbytes")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or \
                not 0 <= nbytes <= MAX_READ_BYTES:
            return "size"
        return None

    async def _read(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        refusal = self._refusal(message)
        if refusal is not None:
            writer.write(frames.encode({"ok": False, "error": refusal}))
            await writer.drain()
            return
        remaining = int(message["nbytes"])
        writer.write(frames.encode({"ok": True, "nbytes": remaining}))
        while remaining:
            n = min(remaining, CHUNK)
            writer.write(self._buffer[:n])
            await writer.drain()
            remaining -= n


async def _reply(reader: asyncio.StreamReader, what: str) -> dict[str, Any]:
    try:
        message = await asyncio.wait_for(frames.read(reader), IDLE_TIMEOUT_S)
    except (frames.FrameError, ConnectionError, TimeoutError) as exc:
        raise TransferError("disconnect", f"{what}: {exc or type(exc).__name__}") from None
    if message is None:
        raise TransferError("disconnect", f"{what}: the producer closed the connection")
    return message


async def _drain_bytes(reader: asyncio.StreamReader, nbytes: int) -> None:
    remaining = nbytes
    while remaining:
        try:
            chunk = await asyncio.wait_for(reader.read(min(remaining, CHUNK)), IDLE_TIMEOUT_S)
        except (ConnectionError, TimeoutError) as exc:
            raise TransferError("disconnect", f"read: {exc or type(exc).__name__}") from None
        if not chunk:
            raise TransferError("disconnect", f"read: connection closed with {remaining} bytes "
                                "outstanding")
        remaining -= len(chunk)


async def read_blocks(peer: AgentBlob, remote_request_id: str, block_ids: list[list[int]],
                      nbytes: int) -> ReadResult:
    """Read `nbytes` of the request's blocks, then notify the producer (which frees them)."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(peer.host, peer.port), CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise TransferError("disconnect", f"connect {peer.host}:{peer.port}: "
                            f"{exc or type(exc).__name__}") from None
    try:
        try:
            writer.write(frames.encode({"op": "read", "req": remote_request_id,
                                        "blocks": block_ids, "nbytes": nbytes,
                                        "incarnation": peer.incarnation}))
            await writer.drain()
        except frames.FrameError as exc:
            raise TransferError("request", str(exc)) from None
        except ConnectionError as exc:
            raise TransferError("disconnect", f"read request: {exc}") from None
        posted = time.perf_counter()
        reply = await _reply(reader, "read reply")
        if not reply.get("ok"):
            raise TransferError(str(reply.get("error")), "refused by the producer")
        await _drain_bytes(reader, nbytes)
        done = time.perf_counter()
        try:
            writer.write(frames.encode({"op": "notif", "req": remote_request_id}))
            await writer.drain()
            await _reply(reader, "notification")
        except (ConnectionError, TransferError) as exc:
            raise TransferError("notify", str(exc)) from None
        return ReadResult(bytes_moved=nbytes, seconds=done - start, post_seconds=posted - start)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def notify(peer: AgentBlob, remote_request_id: str) -> bool:
    """Only the notification (no read): the producer frees the request's blocks if it still
    holds them. Returns whether it did; TransferError("notify") when the producer is gone."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(peer.host, peer.port), CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise TransferError("notify", f"connect {peer.host}:{peer.port}: "
                            f"{exc or type(exc).__name__}") from None
    try:
        writer.write(frames.encode({"op": "notif", "req": remote_request_id}))
        await writer.drain()
        reply = await _reply(reader, "notification")
    except (ConnectionError, TransferError) as exc:
        raise TransferError("notify", str(exc)) from None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return bool(reply.get("freed"))
