"""The side-channel reply the emulator writes is the one vLLM writes, as our parsers read it."""

from __future__ import annotations

import msgpack
import pytest

from narwhal.core.kv.capture.sidechannel import metadata_mismatches, parse_reply
from narwhal.core.kv.versions import V0_29_0
from narwhal.lab.engine.nixl.wire import (
    AgentBlob,
    agent_metadata,
    clock_frame,
    decode_request,
    payload_frame,
)
from tests.unit.engine_nixl.helpers import tiny

BLOB = AgentBlob(agent_name="agent-a", host="10.9.0.2", port=40123, incarnation="n1")


def reply(tp_size: int = 1, tp: int = 0) -> list[bytes]:
    g = tiny(tensor_parallel_size=tp_size)
    meta = agent_metadata(g, V0_29_0, "engine-p", 0, tp, BLOB.encode())
    return [payload_frame(g.compatibility_hash, meta), clock_frame()]


def test_reply_round_trips_through_the_capture_parser_and_matches_the_prediction() -> None:
    g = tiny()
    parsed = parse_reply(reply(), V0_29_0)
    assert parsed.compatibility_hash == g.compatibility_hash
    assert metadata_mismatches(g.stages[0].metadata, parsed.as_agent_metadata()) == []
    assert parsed.metadata["engine_id"] == "engine-p"
    assert parsed.metadata["block_lens"] == [65536, 65536]  # measured on real vLLM CPU
    assert AgentBlob.decode(parsed.metadata["agent_metadata"]) == BLOB


def test_metadata_fields_come_in_vllms_declared_order_with_vllms_types() -> None:
    frames = reply()
    payload = msgpack.unpackb(frames[0], raw=False)
    assert list(payload) == ["compatibility_hash", "agent_metadata_bytes"]
    assert isinstance(payload["agent_metadata_bytes"], bytes)  # msgpack bin, not str
    meta = msgpack.unpackb(payload["agent_metadata_bytes"], raw=False)
    assert tuple(meta) == V0_29_0.metadata_fields
    assert isinstance(meta["agent_metadata"], bytes)
    assert frames[1][0] == 0xCB  # the clock is a float64, as msgspec encodes perf_counter()


def test_each_tp_rank_reports_its_own_device_and_disjoint_plausible_addresses() -> None:
    metas = [parse_reply(reply(2, tp), V0_29_0).metadata for tp in (0, 1)]
    assert [m["device_id"] for m in metas] == [0, 1]
    addrs = [a for m in metas for a in m["kv_caches_base_addr"]]
    assert len(set(addrs)) == 4 and all(a > 1 << 40 for a in addrs)
    assert all(len(m["kv_caches_base_addr"]) == len(m["block_lens"]) for m in metas)


@pytest.mark.parametrize("blob", [b"\x00UCX-blob", b"NWLAB-NIXL\x01\xc1", b""])
def test_a_foreign_or_damaged_agent_blob_is_refused(blob: bytes) -> None:
    with pytest.raises(ValueError, match="agent metadata"):
        AgentBlob.decode(blob)


def test_the_request_frame_decodes_as_vllms_three_values() -> None:
    frame = msgpack.packb([b"get_meta_msg", 0, 1], use_bin_type=True)
    assert decode_request(frame) == (b"get_meta_msg", 0, 1)


@pytest.mark.parametrize("frame", [b"\xc1", msgpack.packb([b"get_meta_msg", 0]),
                                   msgpack.packb(7)])
def test_a_request_that_is_not_three_values_raises_like_vllms_unpacking(frame: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - vLLM's listener dies on any of these
        decode_request(frame)
