"""The side channel's payloads as the emulator writes them: vLLM's frames, our agent blob.

The reply is byte-for-byte the shape vLLM's msgspec encoder produces (a map in declared field
order, bin for bytes, float64 clock), so `core/kv/capture/sidechannel.parse_reply` and our
probe read the emulator and a real engine alike. The `agent_metadata` field is NIXL's opaque
blob; here it carries what a peer needs to reach this engine's block server.

Which fields a reply carries, and in what order, is the version adapter's business
(`VllmFacts.metadata_fields`): 0.29.0 sends 14, 0.32.0 sends 21, its seven per-region fields
computed by core/kv's `region_fields`. Plans core/kv does not model regions for (hybrids,
model types whose layer names it does not know) get a plain one-region-per-layer stand-in, so
the engine still hand-shakes; no reader compares those values with a prediction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack

from narwhal.core.errors import ContractError
from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.regions import region_fields
from narwhal.core.kv.versions import VllmFacts

BLOB_MAGIC = b"NWLAB-NIXL\x01"
# Fake device addresses: a user-space-looking base, one 64 GiB window per rank.
_BASE_ADDR = 0x7F3A_0000_0000
_RANK_WINDOW = 64 << 30
_REGION_ALIGN = 2 << 20
DEFAULT_NUM_BLOCKS = 8192  # kernel blocks reported when the plan gives no KV memory
REGION_FIELDS = ("region_num_blocks", "region_group_ids", "region_names", "region_mem_types",
                 "ple_block_len", "region_members", "packed_member_layouts")


@dataclass(frozen=True)
class AgentBlob:
    """Where a producer's blocks can be read, and which incarnation of its agent serves them."""

    agent_name: str
    host: str
    port: int
    incarnation: str

    def encode(self) -> bytes:
        body: bytes = msgpack.packb(
            {"agent": self.agent_name, "host": self.host, "port": self.port,
             "incarnation": self.incarnation}, use_bin_type=True)
        return BLOB_MAGIC + body

    @classmethod
    def decode(cls, blob: bytes) -> AgentBlob:
        """ValueError when the blob is not ours (e.g. a real engine's UCX agent metadata)."""
        if not blob.startswith(BLOB_MAGIC):
            raise ValueError("the remote agent metadata is not an emulated NIXL agent")
        try:
            data = msgpack.unpackb(blob[len(BLOB_MAGIC):], raw=False)
            return cls(agent_name=str(data["agent"]), host=str(data["host"]),
                       port=int(data["port"]), incarnation=str(data["incarnation"]))
        except Exception as exc:
            raise ValueError(f"the remote agent metadata is damaged ({exc})") from None


def num_kernel_blocks(geometry: Geometry, pp_rank: int = 0) -> int:
    """Kernel blocks per rank: the plan's, or a fixed default when no KV memory was given."""
    predicted = geometry.stages[pp_rank].metadata.num_blocks
    return predicted if predicted is not None else DEFAULT_NUM_BLOCKS


def _base_addrs(geometry: Geometry, pp: int, tp: int) -> list[int]:
    meta = geometry.stages[pp].metadata
    rank = pp * geometry.tp + tp
    start = _BASE_ADDR + rank * _RANK_WINDOW
    size = max(meta.block_strides, default=0) * num_kernel_blocks(geometry, pp)
    step = -(-size // _REGION_ALIGN) * _REGION_ALIGN or _REGION_ALIGN
    return [start + i * step for i in range(meta.num_regions)]


def memory_type(buffer_device: str) -> str:
    """NIXL's memory type for the registered KV cache: DRAM for a CPU buffer, else VRAM."""
    return "DRAM" if buffer_device == "cpu" else "VRAM"


def regions(geometry: Geometry, pp: int, memory: str) -> dict[str, Any]:
    """The per-region fields of rank `pp`: core/kv's prediction, or a stand-in it cannot make."""
    blocks = num_kernel_blocks(geometry, pp)
    try:
        fields = region_fields(geometry, pp, memory=memory)
    except ContractError:
        count = geometry.stages[pp].metadata.num_regions
        fields = {"region_group_ids": [0] * count,
                  "region_names": [f"kv_cache.region.{i}" for i in range(count)],
                  "region_mem_types": [memory] * count, "ple_block_len": None,
                  "region_members": [], "packed_member_layouts": {}}
    return {**fields, "region_num_blocks": [blocks] * len(fields["region_names"])}


def agent_metadata(geometry: Geometry, facts: VllmFacts, engine_id: str, pp: int, tp: int,
                   blob: bytes, memory: str = "VRAM") -> dict[str, Any]:
    """NixlAgentMetadata of one rank: the emulated release's fields, in its declared order."""
    meta = geometry.stages[pp].metadata
    values: dict[str, Any] = {
        "engine_id": engine_id,
        "agent_metadata": blob,
        "kv_caches_base_addr": _base_addrs(geometry, pp, tp),
        "device_id": tp,
        "num_blocks": num_kernel_blocks(geometry, pp),
        "block_lens": list(meta.block_lens),
        "block_strides": list(meta.block_strides),
        "kv_cache_layout": meta.kv_cache_layout,
        "block_size": meta.block_size,
        "ssm_sizes": list(meta.ssm_sizes),
        "attn_backend_name": meta.attn_backend_name,
        "physical_blocks_per_logical_kv_block": meta.physical_blocks_per_logical_kv_block,
        "dcp_size": meta.dcp_size,
        "pcp_size": meta.pcp_size,
    }
    if any(name in REGION_FIELDS for name in facts.metadata_fields):
        values.update(regions(geometry, pp, memory))
    unknown = [name for name in facts.metadata_fields if name not in values]
    if unknown:
        raise ContractError(f"vLLM {facts.release} sends NixlAgentMetadata fields the emulator "
                            f"cannot fill: {', '.join(unknown)}")
    return {name: values[name] for name in facts.metadata_fields}


def payload_frame(compatibility_hash: str, metadata: dict[str, Any]) -> bytes:
    """Frame 1: NixlHandshakePayload {compatibility_hash: str, agent_metadata_bytes: bin}."""
    inner = msgpack.packb(metadata, use_bin_type=True)
    frame: bytes = msgpack.packb(
        {"compatibility_hash": compatibility_hash, "agent_metadata_bytes": inner},
        use_bin_type=True)
    return frame


def clock_frame() -> bytes:
    """Frame 2: the listener's perf_counter as a msgpack float64 (clock-offset estimation)."""
    frame: bytes = msgpack.packb(time.perf_counter(), use_single_float=False)
    return frame


def decode_request(frame: bytes) -> tuple[Any, Any, Any]:
    """`[magic, pp_rank, tp_rank]`; any other shape raises, as vLLM's unpacking does."""
    magic, pp_rank, tp_rank = msgpack.unpackb(frame, raw=False)
    return magic, pp_rank, tp_rank
