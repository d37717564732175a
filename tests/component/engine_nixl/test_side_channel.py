"""The emulator's side channel answers our probe like vLLM and dies on the frames vLLM dies on."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq

from narwhal.core.errors import HostUnreachable
from narwhal.core.kv.capture.sidechannel import metadata_mismatches
from narwhal.lab.engine.nixl.api import KvLoadFailed
from narwhal.node.nixl_probe import probe
from tests.component.engine_nixl.harness import HOST, PROMPT, engine, run, started, target
from tests.unit.engine_nixl.helpers import tiny

pytestmark = pytest.mark.timeout(60)


def raw_request(port: int, frame: bytes, timeout_ms: int = 500) -> list[bytes] | None:
    """A raw REQ exchange (our probe refuses to send bad frames); None when nothing answers."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://{HOST}:{port}")
        sock.send(frame)
        if not sock.poll(timeout_ms):
            return None
        frames: list[bytes] = sock.recv_multipart()
        return frames
    finally:
        sock.close(linger=0)
        ctx.term()


def test_our_probe_reads_every_rank_and_agrees_with_core_kv() -> None:
    p = engine("p", tiny(tensor_parallel_size=2))

    async def scenario() -> None:
        async with started(p):
            replies = await asyncio.to_thread(probe, target(p))
        assert sorted(replies) == [(0, 0), (0, 1)]
        predicted = p.geometry.stages[0].metadata
        for (_, tp), reply in replies.items():
            assert reply.compatibility_hash == p.geometry.compatibility_hash
            assert metadata_mismatches(predicted, reply.as_agent_metadata()) == []
            assert reply.metadata["engine_id"] == p.connector.engine_id
            assert reply.metadata["device_id"] == tp
    run(scenario)


def test_a_wrong_magic_only_warns_and_the_listener_still_replies() -> None:
    p = engine("p")

    async def scenario() -> None:
        async with started(p):
            frame = msgpack.packb([b"get_meta_msk", 0, 0], use_bin_type=True)
            frames = await asyncio.to_thread(raw_request, p.connector.side_channel_port, frame)
            assert frames is not None and len(frames) == 2
            assert p.connector.listener_alive
            assert p.lines.having("Connection listener got unexpected message b'get_meta_msk'")
            assert sorted(await asyncio.to_thread(probe, target(p))) == [(0, 0)]
    run(scenario)


@pytest.mark.parametrize("frame", [
    msgpack.packb([b"get_meta_msg", 0, 5], use_bin_type=True),  # a rank the engine lacks
    msgpack.packb([b"get_meta_msg", 1, 0], use_bin_type=True),
    b"\xc1not msgpack",
    msgpack.packb({"magic": 1}, use_bin_type=True),
], ids=["tp-rank-5", "pp-rank-1", "not-msgpack", "a-map"])
def test_a_bad_rank_or_frame_kills_the_listener_until_restart(frame: bytes) -> None:
    p = engine("p")
    d = engine("d", handshake_timeout_s=0.3)

    async def scenario() -> None:
        async with started(p, d):
            port = p.connector.side_channel_port
            assert await asyncio.to_thread(raw_request, port, frame) is None
            assert not p.connector.listener_alive
            assert p.lines.having("Exception in thread nixl-handshake-listener")
            with pytest.raises(HostUnreachable):
                await asyncio.to_thread(probe, target(p), None, 300)
            params = p.connector.hold("req-1", PROMPT)
            with pytest.raises(KvLoadFailed, match="Resource temporarily unavailable"):
                await d.connector.pull(params, PROMPT)
    run(scenario)


def test_refusing_handshakes_times_the_peer_out_and_recovers_when_cleared() -> None:
    p = engine("p")
    d = engine("d", handshake_timeout_s=0.3)

    async def scenario() -> None:
        async with started(p, d):
            p.faults.refuse_handshakes = True
            params = p.connector.hold("req-1", PROMPT)
            with pytest.raises(KvLoadFailed, match=r"zmq\.error\.Again"):
                await d.connector.pull(params, PROMPT)
            assert d.metrics.failed == 1
            assert d.lines.having("NIXL transfer failure: handshake_setup_failed")
            assert d.lines.having("NIXL transfer failure: handshake_failed")
            assert p.connector.listener_alive  # silent, not dead
            p.faults.refuse_handshakes = False
            outcome = await d.connector.pull(params, PROMPT)  # a failed handshake is not cached
            assert outcome.bytes_moved > 0
    run(scenario)


def test_stopping_an_engine_mid_handshake_returns_promptly() -> None:
    p = engine("p")
    d = engine("d", handshake_timeout_s=30.0)

    async def scenario() -> None:
        async with started(p):
            p.faults.refuse_handshakes = True
            await d.connector.start()
            pull = asyncio.create_task(d.connector.pull(p.connector.hold("r", PROMPT), PROMPT))
            await asyncio.sleep(0.2)
            await asyncio.wait_for(d.connector.stop(), 2.0)
            with pytest.raises(asyncio.CancelledError):
                await pull
    run(scenario)
