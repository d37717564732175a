"""The per-region fields vLLM 0.32.0 adds to NixlAgentMetadata, predicted for simple models.

Since connector version 11 a rank reports, next to `block_lens`, one entry per registered
region (one per KV layer for a plain attention model): its block count, KV cache group, layer
name and memory type, plus three fields that stay empty outside PP push and PLE models. vLLM
encodes every field on every reply, so an emulator answering as 0.32.0 must send them all and a
capture can be checked against them. Only single-group attention models are predicted; hybrids
and sliding-window mixes register regions in an order that was not verified on a live engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from narwhal.core.errors import ContractError
from narwhal.core.kv.geometry import Geometry

# Where the attention module of decoder layer `i` sits, by HF model type: the region name.
_LAYER_NAME: dict[str, Callable[[int], str]] = {
    kind: (lambda i: f"model.layers.{i}.self_attn.attn")
    for kind in ("llama", "mistral", "qwen2", "qwen3")
}
MEMORY_TYPES = ("DRAM", "VRAM")


def region_fields(geometry: Geometry, pp_rank: int = 0, *, memory: str) -> dict[str, Any]:
    """The 0.32.0 region fields rank `pp_rank` reports; `memory` is DRAM (CPU cache) or VRAM.

    Raises ContractError for what is not modelled (several KV cache groups, an unknown model
    type's layer names), so a caller never compares against a guess.
    """
    if memory not in MEMORY_TYPES:
        raise ContractError(f"NIXL memory type {memory!r} is not one of {MEMORY_TYPES}")
    stage = geometry.stages[pp_rank]
    attention = [g for g in stage.groups if g.layers]
    if len(attention) != 1 or attention[0].is_mamba:
        raise ContractError(f"{geometry.engine}: region fields are modelled for one attention "
                            f"KV cache group, this plan has {len(attention)}")
    name = _LAYER_NAME.get(geometry.architecture.model_type)
    if name is None:
        raise ContractError(f"{geometry.engine}: layer names of model type "
                            f"{geometry.architecture.model_type!r} are not modelled "
                            f"(known: {', '.join(sorted(_LAYER_NAME))})")
    layers = attention[0].layers
    blocks = stage.metadata.num_blocks
    return {
        "region_num_blocks": None if blocks is None else [blocks] * len(layers),
        "region_group_ids": [0] * len(layers),
        "region_names": [name(i) for i in layers],
        "region_mem_types": [memory] * len(layers),
        "ple_block_len": None,
        "region_members": [],
        "packed_member_layouts": {},
    }
