"""Read-only NIXL side-channel probe: ask a live engine for each rank's handshake metadata.

The engine's listener thread dies on a request for a rank it does not serve or on a frame it
cannot decode, taking the engine's P/D handshakes with it until restart. So this client builds
every frame through `request_frame` (which refuses nonexistent ranks before anything is sent),
uses a fresh REQ socket per request so a timeout never leaves a half-finished exchange, and
only ever sends the documented `[b"get_meta_msg", pp, tp]` frame.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import zmq

from narwhal.core.errors import ContractError, HostUnreachable
from narwhal.core.kv.capture.sidechannel import HandshakeReply, parse_reply, request_frame
from narwhal.core.kv.versions import facts_for

RECEIVE_TIMEOUT_MS = 5000  # the same timeout vLLM's own initiator uses


@dataclass(frozen=True)
class ProbeTarget:
    """One engine core's side channel and the parallel sizes it was launched with."""

    alias: str
    host: str
    port: int
    pp_size: int
    tp_size: int
    vllm_version: str

    def all_ranks(self) -> list[tuple[int, int]]:
        return [(pp, tp) for pp in range(self.pp_size) for tp in range(self.tp_size)]


def _ask(context: zmq.Context[zmq.Socket[bytes]], target: ProbeTarget, frame: bytes,
         timeout_ms: int) -> list[bytes]:
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
    try:
        sock.connect(f"tcp://{target.host}:{target.port}")
        sock.send(frame)
        frames: list[bytes] = sock.recv_multipart()
        return frames
    except zmq.Again:
        raise HostUnreachable(target.alias, f"side channel on port {target.port} did not reply "
                              f"within {timeout_ms} ms") from None
    finally:
        sock.close(linger=0)


def probe(
    target: ProbeTarget, ranks: Iterable[tuple[int, int]] | None = None,
    timeout_ms: int = RECEIVE_TIMEOUT_MS,
) -> dict[tuple[int, int], HandshakeReply]:
    """Each requested (pp, tp) rank's reply; every frame is validated before the first is sent."""
    facts = facts_for(target.vllm_version)
    wanted = list(ranks) if ranks is not None else target.all_ranks()
    try:
        frames = [(rank, request_frame(rank[0], rank[1], target.pp_size, target.tp_size))
                  for rank in wanted]
    except ValueError as exc:
        raise ContractError(f"{target.alias}: refusing to probe: {exc}") from None
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        return {rank: parse_reply(_ask(context, target, frame, timeout_ms), facts)
                for rank, frame in frames}
    finally:
        context.term()
