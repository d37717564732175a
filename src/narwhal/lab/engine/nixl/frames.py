"""The block server's control frames: a 4-byte big-endian length, then a msgpack map.

Bounded on purpose: a header longer than `MAX_HEADER` or not a map ends the connection, so a
stray client (or a port scan in the lab) cannot make the producer buffer without limit. Bulk
KV bytes follow a read reply raw, never inside a frame.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

MAX_HEADER = 1 << 20  # room for ~200k block ids; far above any one request
_LEN = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent something that is not a control frame, or closed mid-frame."""


def encode(message: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_HEADER:
        raise FrameError(f"control frame of {len(body)} bytes exceeds {MAX_HEADER}")
    return _LEN.pack(len(body)) + body


async def read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None on a clean end of stream between frames."""
    try:
        prefix = await reader.readexactly(_LEN.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("connection closed inside a frame length") from None
    (size,) = _LEN.unpack(prefix)
    if size > MAX_HEADER:
        raise FrameError(f"control frame of {size} bytes exceeds {MAX_HEADER}")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError("connection closed inside a frame") from None
    try:
        message = msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise FrameError(f"undecodable control frame ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise FrameError("control frame is not a map")
    return message
