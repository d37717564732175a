"""Predict one engine's KV geometry, NIXL agent metadata and compatibility hash from its plan.

This is the pipeline of the reference's §10 (steps 1-14) in one pure function, `plan_geometry`,
returning a frozen model that the pair checks, the fabric budget and the CLI all read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from narwhal.core.document_io import StrictModel
from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.arch import Arch, arch_from_config, tp_problems, valid_tp_sizes
from narwhal.core.kv.backends import Backend
from narwhal.core.kv.blocks import (
    BlockSizes,
    content_bytes,
    element_bytes,
    heads_per_rank,
    model_dtype,
    resolve_block_size,
)
from narwhal.core.kv.compat_hash import hash_factors, vllm_hash
from narwhal.core.kv.groups import Group, build_groups, promote_without_hma, stage_layer_range
from narwhal.core.kv.layers import MAMBA_BACKEND
from narwhal.core.kv.layout import BLOCK_OUTERMOST, resolve_layout
from narwhal.core.kv.metadata import AgentMetadata, Capacity, GroupView, StageView, capacity
from narwhal.core.kv.plan import LaunchPlan
from narwhal.core.kv.specs import MambaState, layer_specs, mamba_state
from narwhal.core.kv.versions import VllmFacts, facts_for


class Architecture(StrictModel):
    """Model-level numbers, before any launch choice."""

    model_type: str
    num_hidden_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    is_mla: bool
    is_hybrid: bool
    kv_layers: int
    layer_kinds: dict[str, int]


class Geometry(StrictModel):
    """Everything predicted for one engine; the unit pair checks and budgets work on."""

    engine: str
    plan: LaunchPlan
    release: str
    architecture: Architecture
    dtype: str
    heads_per_rank: int
    element_bytes: int
    content_bytes: int
    bytes_per_token_per_layer: int
    hma_enabled: bool
    block_size: int
    kernel_block_size: int
    physical_per_logical: int
    hybrid_aligned: bool
    mamba_conv_bytes: int
    mamba_ssm_bytes: int
    mamba_conv_pieces: int
    kv_cache_layout: str
    layout_reason: str
    groups: list[GroupView]
    stages: list[StageView]
    capacity: Capacity | None
    hash_factors: dict[str, Any]
    compatibility_hash: str

    @property
    def tp(self) -> int:
        return self.plan.tensor_parallel_size

    @property
    def pp(self) -> int:
        return self.plan.pipeline_parallel_size

    @property
    def has_mamba(self) -> bool:
        return self.mamba_conv_bytes + self.mamba_ssm_bytes > 0


def _backend(plan: LaunchPlan, arch: Arch, facts: VllmFacts) -> Backend:
    if plan.attention_backend is None:
        if arch.is_mla:
            raise InputError(plan.name, [Problem(
                "attention_backend", "an MLA model's default backend depends on the GPU",
                "pin --attention-backend (e.g. FLASH_ATTN_MLA, FLASHMLA, CUTLASS_MLA)")])
        return facts.backend("FLASH_ATTN")
    try:
        backend = facts.backend(plan.attention_backend)
    except Exception as exc:
        raise InputError(plan.name, [Problem("attention_backend", str(exc),
                                             "use a backend name vLLM reports")]) from None
    if backend.is_linear or backend.is_mla != arch.is_mla:
        want = "an MLA" if arch.is_mla else "a non-MLA"
        raise InputError(plan.name, [Problem(
            "attention_backend", f"{backend.name} cannot serve this model", f"use {want} backend")])
    problems: list[Problem] = []
    if backend.head_sizes and arch.head_size not in backend.head_sizes:
        sizes = ", ".join(str(h) for h in backend.head_sizes)
        problems.append(Problem(
            "attention_backend", f"{backend.name} has no kernel for head size {arch.head_size} "
            f"(supports {sizes}); the engine refuses to start",
            "serve a model whose head_dim the backend supports, or use another backend"))
    if backend.kv_cache_dtypes and plan.kv_cache_dtype not in backend.kv_cache_dtypes:
        problems.append(Problem(
            "kv_cache_dtype", f"{backend.name} does not accept {plan.kv_cache_dtype!r}",
            f"use one of {', '.join(backend.kv_cache_dtypes)}"))
    if problems:
        raise InputError(plan.name, problems)
    return backend


def _check_parallel(plan: LaunchPlan, arch: Arch) -> None:
    problems: list[Problem] = []
    reasons = tp_problems(arch, plan.tensor_parallel_size)
    if reasons:
        valid = ", ".join(str(t) for t in valid_tp_sizes(arch))
        problems.append(Problem("tensor_parallel_size",
                                f"TP {plan.tensor_parallel_size} is invalid: {'; '.join(reasons)}",
                                f"use one of the valid sizes: {valid}"))
    if plan.pipeline_parallel_size > arch.num_layers:
        problems.append(Problem("pipeline_parallel_size",
                                f"{plan.pipeline_parallel_size} stages for {arch.num_layers} "
                                "layers",
                                "use at most one stage per layer"))
    if problems:
        raise InputError(plan.name, problems)


def _hma(plan: LaunchPlan, arch: Arch) -> bool:
    """§3.4: NixlConnector supports HMA: on unless disabled or the model is chunked-local."""
    if plan.disable_hybrid_kv_cache_manager is not None:
        return not plan.disable_hybrid_kv_cache_manager
    return not any(k.kind == "chunked" for k in arch.layers)


def plan_geometry(config: Mapping[str, Any], plan: LaunchPlan) -> Geometry:
    """Predict the engine's geometry, metadata and hash; InputError names what cannot be served."""
    facts = facts_for(plan.vllm_version)
    arch = arch_from_config(config, source=f"{plan.name}: config.json")
    _check_parallel(plan, arch)
    backend = _backend(plan, arch, facts)
    tp = plan.tensor_parallel_size
    hma = _hma(plan, arch)
    kinds = promote_without_hma(arch.layers, hma)
    unit = heads_per_rank(arch, tp) * content_bytes(arch, plan, backend)
    state = mamba_state(arch, plan, arch.mamba, tp) if arch.mamba else None
    sizes = resolve_block_size(plan, backend, unit, state.total if state else 0, arch.is_hybrid)
    specs = layer_specs(kinds, unit, sizes.block_size, state)
    groups = build_groups(specs)
    linear = tuple(facts.backend(MAMBA_BACKEND[k]) for k in {k.kind for k in kinds if k.is_mamba})
    mixed = len({(s.kind in ("mamba1", "mamba2", "gdn"), s.page) for s in specs}) > 1
    layout, why = resolve_layout(plan.name, (backend, *linear), plan.kv_cache_layout,
                                 arch.is_mla, mixed)
    first = kinds[0]
    first_backend = MAMBA_BACKEND[first.kind] if first.is_mamba else backend.name
    factors = hash_factors(
        plan, facts, dtype=model_dtype(arch, plan), num_kv_heads=arch.num_kv_heads,
        head_size=arch.head_size, num_hidden_layers=arch.num_layers,
        backend_name=first_backend, hma=hma)
    stages = [_stage(plan, arch, groups, sizes, layout, state, first_backend, p)
              for p in range(plan.pipeline_parallel_size)]
    return Geometry(
        engine=plan.name, plan=plan, release=facts.release,
        architecture=_architecture(arch),
        dtype=model_dtype(arch, plan), heads_per_rank=heads_per_rank(arch, tp),
        element_bytes=element_bytes(arch, plan), content_bytes=content_bytes(arch, plan, backend),
        bytes_per_token_per_layer=unit, hma_enabled=hma, block_size=sizes.block_size,
        kernel_block_size=sizes.kernel_block_size, physical_per_logical=sizes.ratio,
        hybrid_aligned=sizes.hybrid_aligned,
        mamba_conv_bytes=state.conv_bytes if state else 0,
        mamba_ssm_bytes=state.ssm_bytes if state else 0,
        mamba_conv_pieces=arch.mamba.conv_pieces if arch.mamba else 0,
        kv_cache_layout=layout, layout_reason=why,
        groups=[GroupView(kind=g.kind, window=g.window, page_bytes=g.page, layers=list(g.layers))
                for g in groups],
        stages=stages,
        capacity=capacity(plan, groups, stages[0].bytes_per_block, sizes.block_size),
        hash_factors=factors, compatibility_hash=vllm_hash(factors),
    )


def _architecture(arch: Arch) -> Architecture:
    counts: dict[str, int] = {}
    for k in arch.layers:
        counts[k.kind] = counts.get(k.kind, 0) + 1
    return Architecture(
        model_type=arch.model_type, num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads, num_kv_heads=arch.num_kv_heads,
        head_size=arch.head_size, is_mla=arch.is_mla, is_hybrid=arch.is_hybrid,
        kv_layers=len(arch.layers), layer_kinds=counts)


def _stage(
    plan: LaunchPlan, arch: Arch, groups: tuple[Group, ...], sizes: BlockSizes, layout: str,
    state: MambaState | None, backend_name: str, pp_rank: int,
) -> StageView:
    """One PP stage's share of every group, its per-rank bytes and predicted agent metadata."""
    span = stage_layer_range(arch.num_layers, plan.pipeline_parallel_size, pp_rank)
    local = [GroupView(kind=g.kind, window=g.window, page_bytes=g.page,
                       layers=[i for i in g.layers if i in span]) for g in groups]
    regions = max((len(g.layers) for g in local), default=0)
    per_block = max((g.page_bytes * len(g.layers) for g in local), default=0)
    per_token = sum(len(g.layers) * g.page_bytes // sizes.block_size
                    for g in local if not g.is_mamba)
    r = sizes.ratio
    page = max((g.page_bytes for g in local), default=0)
    stride = per_block // r if layout in BLOCK_OUTERMOST else page // r
    num_blocks = None
    if plan.available_kv_bytes is not None and per_block:
        num_blocks = plan.available_kv_bytes // per_block * r
    meta = AgentMetadata(
        num_regions=regions, block_lens=[page // r] * regions, block_strides=[stride] * regions,
        block_size=sizes.kernel_block_size, kv_cache_layout=layout,
        ssm_sizes=[state.conv_bytes, state.ssm_bytes] if state else [0, 0],
        attn_backend_name=backend_name, physical_blocks_per_logical_kv_block=r,
        num_blocks=num_blocks, dcp_size=1, pcp_size=1)
    return StageView(pp_rank=pp_rank, first_layer=span.start, last_layer=span.stop - 1,
                     groups=local, bytes_per_token=per_token, bytes_per_block=per_block,
                     metadata=meta)
