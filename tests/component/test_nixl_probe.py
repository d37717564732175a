"""The side-channel probe speaks vLLM's wire format and can never take a listener down."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgpack
import pytest
import zmq

from narwhal.core.errors import ContractError, HostUnreachable
from narwhal.node.nixl_probe import ProbeTarget, probe


@dataclass
class Listener:
    """A ROUTER socket answering like vLLM's side channel, recording every frame it receives."""

    pp_size: int
    tp_size: int
    port: int = 0
    received: list[list[bytes]] = field(default_factory=list)
    died: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def reply_for(self, pp: int, tp: int) -> list[bytes]:
        meta = {"engine_id": "engine-a", "agent_metadata": b"blob",
                "kv_caches_base_addr": [4096 * (tp + 1)], "device_id": tp, "num_blocks": 100,
                "block_lens": [8192], "block_strides": [8192], "kv_cache_layout": "LBHNC",
                "block_size": 16, "ssm_sizes": [0, 0], "attn_backend_name": "FLASH_ATTN",
                "physical_blocks_per_logical_kv_block": 1, "dcp_size": 1, "pcp_size": 1}
        payload = {"compatibility_hash": f"hash-{pp}-{tp}",
                   "agent_metadata_bytes": msgpack.packb(meta, use_bin_type=True)}
        return [msgpack.packb(payload, use_bin_type=True), msgpack.packb(12.5)]

    def serve(self, sock: zmq.Socket[bytes]) -> None:
        while not self.stop.is_set():
            if not sock.poll(50):
                continue
            identity, empty, frame = sock.recv_multipart()
            self.received.append([frame])
            magic, pp, tp = msgpack.unpackb(frame)
            if magic != b"get_meta_msg":
                continue  # vLLM only warns on a wrong magic string
            if not (0 <= pp < self.pp_size and 0 <= tp < self.tp_size):
                self.died = True  # vLLM's listener thread raises and ends here
                return
            sock.send_multipart([identity, empty, *self.reply_for(pp, tp)])


@pytest.fixture
def listener() -> Iterator[Listener]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    state = Listener(pp_size=1, tp_size=2)
    state.port = sock.bind_to_random_port("tcp://127.0.0.1")
    thread = threading.Thread(target=state.serve, args=(sock,), daemon=True)
    thread.start()
    yield state
    state.stop.set()
    thread.join(timeout=2)
    sock.close()
    ctx.term()


def target(listener: Listener, tp_size: int = 2) -> ProbeTarget:
    return ProbeTarget(alias="engine-a", host="127.0.0.1", port=listener.port, pp_size=1,
                       tp_size=tp_size, vllm_version="0.29.0")


def test_probe_asks_every_existing_rank_with_the_documented_frame(listener: Listener) -> None:
    replies = probe(target(listener))
    assert sorted(replies) == [(0, 0), (0, 1)]
    assert replies[(0, 1)].compatibility_hash == "hash-0-1"
    assert replies[(0, 1)].metadata["block_lens"] == [8192]
    assert replies[(0, 0)].listener_clock == 12.5
    assert [msgpack.unpackb(f[0]) for f in listener.received] == [
        [b"get_meta_msg", 0, 0], [b"get_meta_msg", 0, 1]]
    assert not listener.died


def test_probe_refuses_a_nonexistent_rank_before_sending_anything(listener: Listener) -> None:
    with pytest.raises(ContractError, match="tp_rank 2 does not exist"):
        probe(target(listener), ranks=[(0, 0), (0, 2)])
    assert listener.received == []  # not even the valid rank went out
    assert not listener.died
    assert sorted(probe(target(listener))) == [(0, 0), (0, 1)]  # the listener still answers


def test_probe_of_an_unknown_vllm_release_is_refused_naming_it(listener: Listener) -> None:
    bad = ProbeTarget(alias="engine-a", host="127.0.0.1", port=listener.port, pp_size=1,
                      tp_size=2, vllm_version="0.30.1")
    with pytest.raises(ContractError, match=r"0\.30\.1"):
        probe(bad)
    assert listener.received == []


def test_probe_of_a_silent_port_times_out_as_an_unreachable_host() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        quiet = ProbeTarget(alias="engine-b", host="127.0.0.1", port=port, pp_size=1,
                            tp_size=1, vllm_version="0.29.0")
        with pytest.raises(HostUnreachable, match="engine-b"):
            probe(quiet, timeout_ms=200)
    finally:
        silent.close(linger=0)
        ctx.term()
