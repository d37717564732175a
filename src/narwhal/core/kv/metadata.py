"""Result shapes of a geometry prediction: groups, PP stages, NIXL agent metadata, capacity.

Kept apart from the pipeline so the live side-channel reply can be compared field by field with
`AgentMetadata` without importing the planner.
"""

from __future__ import annotations

from narwhal.core.document_io import StrictModel
from narwhal.core.kv.blocks import cdiv
from narwhal.core.kv.groups import Group
from narwhal.core.kv.plan import LaunchPlan


class GroupView(StrictModel):
    """One KV cache group (or its share on one PP stage)."""

    kind: str
    window: int | None
    page_bytes: int
    layers: list[int]

    @property
    def is_mamba(self) -> bool:
        return self.kind in ("mamba1", "mamba2", "gdn")


class AgentMetadata(StrictModel):
    """The NixlAgentMetadata fields a rank will report, minus addresses and the opaque blob."""

    num_regions: int
    block_lens: list[int]
    block_strides: list[int]
    block_size: int
    kv_cache_layout: str
    ssm_sizes: list[int]
    attn_backend_name: str
    physical_blocks_per_logical_kv_block: int
    num_blocks: int | None
    dcp_size: int
    pcp_size: int


class StageView(StrictModel):
    """What every TP rank of one PP stage holds: the same shape on each rank."""

    pp_rank: int
    first_layer: int
    last_layer: int
    groups: list[GroupView]
    bytes_per_token: int
    bytes_per_block: int
    metadata: AgentMetadata


class Capacity(StrictModel):
    """num_blocks and concurrency as vLLM logs them, when available KV bytes are given."""

    num_blocks: int
    blocks_per_request: int | None
    max_concurrency: float | None
    kv_cache_size_tokens: int | None


def capacity(
    plan: LaunchPlan, groups: tuple[Group, ...], bytes_per_block: int, block_size: int
) -> Capacity | None:
    """Capacity of the first stage; concurrency only for full-attention/MLA groups (exact there)."""
    if plan.available_kv_bytes is None or not bytes_per_block:
        return None
    num_blocks = plan.available_kv_bytes // bytes_per_block
    if plan.max_model_len is None or any(g.kind not in ("full", "mla") for g in groups):
        return Capacity(num_blocks=num_blocks, blocks_per_request=None, max_concurrency=None,
                        kv_cache_size_tokens=None)
    per_request = len(groups) * cdiv(plan.max_model_len, block_size)
    concurrency = num_blocks / per_request
    return Capacity(num_blocks=num_blocks, blocks_per_request=per_request,
                    max_concurrency=concurrency,
                    kv_cache_size_tokens=int(concurrency * plan.max_model_len))
