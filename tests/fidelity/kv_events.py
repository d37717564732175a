"""The shape of a KV event batch as a subscriber sees it on the wire, for comparing an engine
with the batch a live vLLM 0.32 CPU engine published (tests/fixtures/vllm-0.32.0/
kv-events-live-batch.msgpack): frames, the batch array, each event's keys and value types."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

LIVE = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0" / "kv-events-live-batch.msgpack"


def _kind(value: Any) -> str:
    if isinstance(value, list):
        inner = sorted({_kind(v) for v in value})
        return f"list[{'|'.join(inner)}]"
    return type(value).__name__


def shape(payload: bytes) -> dict[str, Any]:
    """The batch's layout and, per event type, its keys with the type of each value."""
    body = msgpack.unpackb(payload, raw=False)
    events: dict[str, dict[str, str]] = {}
    for event in body[1]:
        events.setdefault(event["type"], {k: _kind(v) for k, v in sorted(event.items())})
    return {"batch": [_kind(v) if not isinstance(v, list) else "list" for v in body],
            "events": events}


def first_batch(endpoint: str, send: Any, timeout_ms: int = 10_000) -> list[bytes]:
    """Subscribe to `endpoint`, call `send()` (which makes the engine store blocks) and return
    the first multipart message published."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.SUB)
    try:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        sock.connect(endpoint)
        time.sleep(0.3)  # the subscription reaches the publisher
        send()
        return sock.recv_multipart()
    finally:
        sock.close(linger=0)
