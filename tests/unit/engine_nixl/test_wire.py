"""The side-channel reply the emulator writes is the one vLLM writes, as our parsers read it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgpack
import pytest

from narwhal.core.errors import ContractError
from narwhal.core.kv.capture.sidechannel import metadata_mismatches, parse_reply
from narwhal.core.kv.geometry import plan_geometry
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.versions import V0_29_0, V0_32_0
from narwhal.lab.engine.nixl.wire import (
    AgentBlob,
    agent_metadata,
    clock_frame,
    decode_request,
    payload_frame,
)
from tests.unit.engine_nixl.helpers import tiny
from tests.unit.kv.helpers import config

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


REAL = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32.0"


def real_metadata() -> dict[str, object]:
    payload = msgpack.unpackb((REAL / "sidechannel-reply.frame0.bin").read_bytes(), raw=False)
    meta: dict[str, object] = msgpack.unpackb(payload["agent_metadata_bytes"], raw=False)
    return meta


def test_a_0_32_reply_carries_the_captured_engines_21_fields_and_values() -> None:
    """The real tier's engine (64 MiB of KV, 512 tokens, CPU buffer): every field but the ids,
    the opaque NIXL blob and the device addresses equals the capture, in the same order."""
    g = tiny(vllm_version="0.32.0", max_model_len=512, available_kv_bytes=64 << 20)
    meta = agent_metadata(g, V0_32_0, "engine-p", 0, 0, BLOB.encode(), "DRAM")
    real = real_metadata()
    assert tuple(meta) == tuple(real) == V0_32_0.metadata_fields
    for key in set(real) - {"engine_id", "agent_metadata", "kv_caches_base_addr"}:
        assert meta[key] == real[key], key
    parsed = parse_reply([payload_frame(g.compatibility_hash, meta), clock_frame()], V0_32_0)
    assert metadata_mismatches(g.stages[0].metadata, parsed.as_agent_metadata()) == []


def test_a_gpu_buffer_registers_vram_regions() -> None:
    g = tiny(vllm_version="0.32.0")
    meta = agent_metadata(g, V0_32_0, "engine-p", 0, 0, BLOB.encode(), "VRAM")
    assert meta["region_mem_types"] == ["VRAM", "VRAM"]
    assert meta["region_num_blocks"] == [meta["num_blocks"]] * 2


def test_a_plan_core_kv_has_no_region_model_for_still_gets_every_field() -> None:
    """A hybrid: core/kv does not predict its regions, the emulator still answers with 21."""
    g = plan_geometry(config("qwen3-next-80b"), LaunchPlan(
        model="/m/qwen3-next", vllm_version="0.32.0", tensor_parallel_size=4,
        available_kv_bytes=8 << 30, max_model_len=4096))
    meta = agent_metadata(g, V0_32_0, "engine-p", 0, 0, BLOB.encode(), "VRAM")
    assert tuple(meta) == V0_32_0.metadata_fields
    assert len(meta["region_names"]) == len(meta["region_num_blocks"]) == len(
        meta["block_lens"])


def test_a_release_with_a_field_the_emulator_cannot_fill_is_refused_by_name() -> None:
    facts = dataclasses.replace(V0_32_0, metadata_fields=(*V0_32_0.metadata_fields, "new_x"))
    with pytest.raises(ContractError, match="cannot fill: new_x"):
        agent_metadata(tiny(vllm_version="0.32.0"), facts, "engine-p", 0, 0, BLOB.encode())
