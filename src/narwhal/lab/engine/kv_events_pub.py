"""The emulator's KV event publisher: vLLM's ZmqEventPublisher, as a subscriber sees it.

Events raised while the event loop runs one step are sent as one batch (vLLM sends one batch
per engine step), numbered from 0 on a PUB socket bound or connected by vLLM's rule (a `*`,
`::`, `ipc://` or `inproc://` endpoint binds, any other connects). A subscriber that cannot
keep up loses batches at the high-water mark, as with vLLM, and sees the gap in the numbers.
"""

from __future__ import annotations

import asyncio
import time

import zmq

from narwhal.core.kv.events import Event, EventBatch, EventsConfig, encode_frames


class KvEventPublisher:
    """One PUB socket per engine; `add` is the prefix cache's event sink."""

    def __init__(self, config: EventsConfig, data_parallel_rank: int) -> None:
        self._topic = config.topic.encode()
        self._rank = data_parallel_rank
        self._seq = 0
        self._pending: list[Event] = []
        self._scheduled = False
        self.sent = 0
        self.dropped = 0
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._socket.set_hwm(config.hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        endpoint = config.endpoint
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)

    def add(self, events: list[Event]) -> None:
        self._pending.extend(events)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        batch = EventBatch(self._seq, time.time(), tuple(self._pending), self._rank)
        self._pending = []
        self._seq += 1
        try:
            self._socket.send_multipart(encode_frames(self._topic, batch), flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._socket.close(linger=0)
