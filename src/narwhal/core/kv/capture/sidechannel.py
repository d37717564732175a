"""The NIXL side-channel wire format: the request frame a probe may send and the reply it gets.

The listener thread in a vLLM engine dies on an unknown (pp, tp) key or an undecodable frame,
and with it the engine's ability to hand-shake. So the only way to build a request is
`request_frame`, which refuses ranks that do not exist; replies are decoded in two phases like
vLLM does (hash first, then metadata) and checked against the version adapter's field list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from narwhal.core.errors import ContractError
from narwhal.core.kv.metadata import AgentMetadata
from narwhal.core.kv.versions import VllmFacts

MAGIC = b"get_meta_msg"


def request_frame(pp_rank: int, tp_rank: int, pp_size: int, tp_size: int) -> bytes:
    """msgpack `[b"get_meta_msg", pp, tp]` for a rank that exists; ValueError otherwise."""
    for name, rank, size in (("pp_rank", pp_rank, pp_size), ("tp_rank", tp_rank, tp_size)):
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"{name} {rank!r} does not exist (size {size}); asking for it would "
                             "kill the engine's side-channel listener")
    frame: bytes = msgpack.packb([MAGIC, pp_rank, tp_rank], use_bin_type=True)
    return frame


@dataclass(frozen=True)
class HandshakeReply:
    """One rank's reply: its compatibility hash, decoded metadata and the listener's clock."""

    compatibility_hash: str
    metadata: dict[str, Any]
    listener_clock: float

    def as_agent_metadata(self) -> AgentMetadata:
        """The comparable subset, shaped like the prediction."""
        m = self.metadata
        return AgentMetadata(
            num_regions=len(m["block_lens"]), block_lens=list(m["block_lens"]),
            block_strides=list(m["block_strides"]), block_size=m["block_size"],
            kv_cache_layout=m["kv_cache_layout"], ssm_sizes=list(m["ssm_sizes"]),
            attn_backend_name=m["attn_backend_name"],
            physical_blocks_per_logical_kv_block=m["physical_blocks_per_logical_kv_block"],
            num_blocks=m["num_blocks"], dcp_size=m["dcp_size"], pcp_size=m["pcp_size"])


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise ContractError(f"cannot decode {what} ({type(exc).__name__}); the engine speaks a "
                            "different side-channel wire format") from None


def parse_reply(frames: list[bytes], facts: VllmFacts) -> HandshakeReply:
    """Decode the two reply frames; unknown or missing metadata fields name the vLLM release."""
    if len(frames) != 2:
        raise ContractError(f"side-channel reply has {len(frames)} frames, expected 2")
    payload = _unpack(frames[0], "NixlHandshakePayload")
    if not isinstance(payload, dict) or set(payload) != {"compatibility_hash",
                                                         "agent_metadata_bytes"}:
        raise ContractError(f"NixlHandshakePayload has keys {sorted(payload or {})!r}, expected "
                            "compatibility_hash and agent_metadata_bytes")
    clock = _unpack(frames[1], "listener clock")
    if isinstance(clock, bool) or not isinstance(clock, (int, float)):
        raise ContractError(f"listener clock frame is {clock!r}, expected a float")
    meta = _unpack(payload["agent_metadata_bytes"], "NixlAgentMetadata")
    if not isinstance(meta, dict):
        raise ContractError("NixlAgentMetadata is not a map")
    missing = [f for f in facts.metadata_fields if f not in meta]
    unknown = sorted(set(meta) - set(facts.metadata_fields) - set(facts.metadata_optional_fields))
    if missing or unknown:
        raise ContractError(
            f"NixlAgentMetadata does not match vLLM {facts.release}: missing {missing}, "
            f"unexpected {unknown}; check the engine's /version against the planned release")
    return HandshakeReply(str(payload["compatibility_hash"]), meta, float(clock))


def metadata_mismatches(predicted: AgentMetadata, live: AgentMetadata) -> list[str]:
    """Fields where the live rank differs from the prediction (num_blocks only when predicted)."""
    out: list[str] = []
    for field, want in predicted.model_dump().items():
        got = getattr(live, field)
        if field == "num_blocks" and want is None:
            continue
        if want != got:
            out.append(f"{field}: predicted {want!r}, engine reports {got!r}")
    return out
