"""The side-channel listener: a ZMQ ROUTER answering vLLM's metadata request, quirks included.

vLLM's listener thread only warns on a wrong magic string but dies on an unknown (pp, tp) key
or a frame it cannot unpack, and nothing restarts it: the engine keeps serving HTTP but can no
longer hand-shake. The emulator keeps that behaviour (a probe that breaks it here would break
a real engine) and logs the death, which vLLM only prints as a thread traceback.

Fault `refuse_handshakes`: the listener receives and stays silent, so the initiator times out
after 5 s. That is what a peer sees from a real engine whose side channel cannot answer (dead
listener thread, unreachable or loopback-only VLLM_NIXL_SIDE_CHANNEL_HOST); a real engine never
answers with a wrong hash on purpose, and a true mismatch is emulated by different plans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

import zmq
import zmq.asyncio

from narwhal.core.kv.capture.sidechannel import MAGIC
from narwhal.lab.engine.nixl.settings import FaultSwitches
from narwhal.lab.engine.nixl.wire import clock_frame, decode_request


def zmq_path(host: str, port: int) -> str:
    """tcp://host:port, with brackets for an IPv6 literal (as vLLM's make_zmq_path)."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class SideChannelListener:
    """One engine core's listener, serving every (pp, tp) rank from one ROUTER socket."""

    def __init__(self, context: zmq.asyncio.Context, host: str, port: int,
                 payloads: Callable[[], Mapping[tuple[int, int], bytes]],
                 faults: FaultSwitches, log: logging.Logger) -> None:
        self.path = zmq_path(host, port)
        self._context = context
        self._payloads = payloads
        self._faults = faults
        self._log = log
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.dead = False

    async def start(self) -> None:
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.path.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        try:
            sock.bind(self.path)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise RuntimeError(f"NIXL side channel cannot bind {self.path}: {exc}") from None
        self._sock = sock
        self._log.debug("Starting listening on path: %s", self.path)
        self._task = asyncio.create_task(self._serve(sock), name="nixl-side-channel")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._close()

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def _serve(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames: list[bytes] = await sock.recv_multipart()
            try:
                identity, _, message = frames
                magic, pp_rank, tp_rank = decode_request(message)
                if magic != MAGIC:
                    self._log.warning("Connection listener got unexpected message %s", magic)
                payload = self._payloads()[(pp_rank, tp_rank)]
            except Exception as exc:
                self._die(exc)
                return
            if self._faults.refuse_handshakes:
                self._log.debug("fault refuse_handshakes: not answering the side-channel "
                                "request for rank (%s, %s)", pp_rank, tp_rank)
                continue
            await sock.send_multipart([identity, b"", payload, clock_frame()])

    def _die(self, exc: Exception) -> None:
        """vLLM's listener thread has no handler: it ends, and so does the socket."""
        self.dead = True
        self._log.error(
            "Exception in thread nixl-handshake-listener: %s: %s. The NIXL side channel on %s "
            "is down; this engine cannot hand-shake until it restarts", type(exc).__name__, exc,
            self.path)
        self._close()
