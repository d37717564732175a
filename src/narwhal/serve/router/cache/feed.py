"""Subscribing to an engine's KV cache events: the I/O edge of the router's cache state.

One SUB socket per engine, connected to the endpoint its launch publishes on. Frames are
bounded by ZMQ itself (a peer that sends a part over the payload limit is disconnected before
the bytes are kept) and by core/kv/events.py; a frame that breaks the format makes the
engine's cache forget what it knew (index.py says why). The receive loop runs until
cancelled; a dead publisher just sends nothing, and ZMQ reconnects when it is back.
"""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from narwhal.core.kv.events import MAX_PAYLOAD_BYTES, EventFormatError, decode_frames
from narwhal.serve.router.cache.index import EngineCache

log = logging.getLogger("narwhal.serve.cache")
RECEIVE_HWM = 10_000


async def follow(name: str, endpoint: str, topic: str, cache: EngineCache,
                 ready: asyncio.Event | None = None) -> None:
    """Apply every batch `endpoint` publishes on `topic` to `cache`, until cancelled."""
    context = zmq.asyncio.Context.instance()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sock.connect(endpoint)
    if ready is not None:
        ready.set()
    warned = False
    try:
        while True:
            frames = await sock.recv_multipart()
            try:
                _, batch = decode_frames(frames)
            except EventFormatError as exc:
                cache.refused()
                if not warned:
                    log.warning("engine %s: KV event frame refused, its cache state is learned "
                                "again: %s", name, exc)
                    warned = True
                continue
            cache.apply(batch)
    finally:
        sock.close(linger=0)
