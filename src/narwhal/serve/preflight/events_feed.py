"""A short-lived subscription to one engine's KV cache events, for the events gate.

Unlike the router's follower (router/cache/feed.py), which only ever waits, the check must
tell "nothing listens at the endpoint" from "it listens but says nothing", so the SUB socket
is watched by a ZMQ monitor until its handshake with the publisher succeeds. A PUB socket
drops what it sends before a subscription reaches it, so the caller's prompt goes only after
the handshake and a short settle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from narwhal.core.kv.events import (
    MAX_PAYLOAD_BYTES,
    EventBatch,
    EventFormatError,
    decode_frames,
)


class EventIndex(Protocol):
    """What a router learns from one engine's events. narwhal-check wires in the router's own
    index (check_cli.py; preflight never imports the router), so the gate holds the router's
    prediction to the engine, not a copy of its rules."""

    @property
    def batches(self) -> int: ...

    def apply(self, batch: EventBatch) -> None: ...

    def refused(self) -> None: ...

    def matched_tokens(self, token_ids: Sequence[int]) -> int: ...

# After the handshake, the SUB socket's subscription still has to reach the publisher.
SETTLE_S = 0.2


async def _handshake(monitor: zmq.asyncio.Socket, within_s: float) -> bool:
    """True once the SUB socket completed a ZMTP handshake with a publisher."""
    try:
        async with asyncio.timeout(within_s):
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return True
    except TimeoutError:
        return False


async def _receive(sock: zmq.asyncio.Socket, cache: EventIndex) -> None:
    """Apply every batch to `cache` until cancelled; a frame it cannot read is counted."""
    while True:
        frames = await sock.recv_multipart()
        try:
            _, batch = decode_frames(frames)
        except EventFormatError:
            cache.refused()
            continue
        cache.apply(batch)


@contextlib.asynccontextmanager
async def subscribed(endpoint: str, topic: str, cache: EventIndex,
                     connect_s: float) -> AsyncIterator[bool]:
    """Subscribe to `endpoint`; yields whether a publisher answered within `connect_s`, and
    while inside, every batch it sends is applied to `cache`."""
    sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    task: asyncio.Task[None] | None = None
    try:
        sock.connect(endpoint)
        connected = await _handshake(monitor, connect_s)
        if connected:
            task = asyncio.create_task(_receive(sock, cache))
            await asyncio.sleep(SETTLE_S)
        yield connected
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
