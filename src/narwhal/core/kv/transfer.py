"""What one handoff moves over the fabric (pull mode): blocks per group, bytes and descriptors.

The consumer reads whole blocks, the half-empty last one included, so bytes are counted in
blocks, not tokens. Each consumer rank reads its own page size per block (heterogeneous TP
slices the producer's blocks to fit), so these numbers are always the consumer's geometry.
"""

from __future__ import annotations

from narwhal.core.document_io import StrictModel
from narwhal.core.kv.blocks import cdiv
from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.metadata import GroupView


class StageTransfer(StrictModel):
    """Per consumer rank of one PP stage."""

    pp_rank: int
    blocks_per_group: list[int]
    bytes_per_rank: int
    descriptors_per_rank: int


class RequestTransfer(StrictModel):
    """One request of `prompt_tokens` handed from producer to this consumer geometry."""

    prompt_tokens: int
    transferred_tokens: int
    stages: list[StageTransfer]
    total_bytes: int


def _blocks(group: GroupView, tokens: int, block_size: int, hma: bool) -> int:
    full = cdiv(tokens, block_size)
    if group.is_mamba:
        return 1  # one whole recurrent state per request (modes none/align)
    if group.kind == "sliding" and hma and group.window is not None:
        return min(full, cdiv(group.window, block_size) + 1)
    return full


def request_transfer(geometry: Geometry, prompt_tokens: int) -> RequestTransfer:
    """Bytes and descriptors per consumer rank and over all consumer ranks, for one request."""
    # Mamba hybrids: P drops the last prompt token so D can recompute it and derive the state.
    tokens = prompt_tokens - 1 if geometry.has_mamba else prompt_tokens
    r = geometry.physical_per_logical
    stages: list[StageTransfer] = []
    for stage in geometry.stages:
        counts: list[int] = []
        nbytes = descriptors = 0
        for group in stage.groups:
            n = _blocks(group, tokens, geometry.block_size, geometry.hma_enabled)
            counts.append(n)
            if group.is_mamba:
                state = geometry.mamba_conv_bytes + geometry.mamba_ssm_bytes
                nbytes += len(group.layers) * state
                descriptors += len(group.layers) * (geometry.mamba_conv_pieces + 1)
            else:
                nbytes += n * group.page_bytes * len(group.layers)
                descriptors += n * r * len(group.layers)
        stages.append(StageTransfer(pp_rank=stage.pp_rank, blocks_per_group=counts,
                                    bytes_per_rank=nbytes, descriptors_per_rank=descriptors))
    total = geometry.tp * sum(s.bytes_per_rank for s in stages)
    return RequestTransfer(prompt_tokens=prompt_tokens, transferred_tokens=tokens,
                           stages=stages, total_bytes=total)
