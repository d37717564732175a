"""Bytes per element, the per-token page unit, and the block-size pipeline (logical and kernel).

The block size is not a free choice in vLLM: the backend may raise it, hybrids align it so one
attention page holds a whole Mamba state (which makes it depend on TP), and the kernel may split
it. NIXL moves kernel blocks, so both sizes and their ratio `r` are predicted here.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.arch import DTYPE_BYTES, Arch
from narwhal.core.kv.backends import Backend
from narwhal.core.kv.plan import KV_DTYPE_BYTES, LaunchPlan

_PER_TOKEN_HEAD = ("fp8_per_token_head", "int8_per_token_head", "int4_per_token_head")
FP8_DS_MLA_CONTENT = 656  # 512 latent fp8 + scales + 64 rope in bf16, per token


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def model_dtype(arch: Arch, plan: LaunchPlan) -> str:
    """Runtime dtype: an explicit --dtype wins; `auto` follows the config, downcasting float32."""
    if plan.dtype != "auto":
        return plan.dtype
    return "bfloat16" if arch.config_dtype == "float32" else arch.config_dtype


def element_bytes(arch: Arch, plan: LaunchPlan) -> int:
    """Bytes per stored KV element for the plan's kv_cache_dtype."""
    if plan.kv_cache_dtype == "auto":
        return DTYPE_BYTES[model_dtype(arch, plan)]
    return KV_DTYPE_BYTES[plan.kv_cache_dtype]


def heads_per_rank(arch: Arch, tp: int) -> int:
    """KV heads one TP rank holds: MLA keeps one latent per rank, GQA replicates when tp > K."""
    return 1 if arch.is_mla else max(1, arch.num_kv_heads // tp)


def content_bytes(arch: Arch, plan: LaunchPlan, backend: Backend) -> int:
    """`C`: bytes one head slot stores per token (K and V packed together for non-MLA)."""
    s = element_bytes(arch, plan)
    dtype = plan.kv_cache_dtype
    if arch.is_mla and dtype == "fp8_ds_mla":
        return FP8_DS_MLA_CONTENT
    if dtype in _PER_TOKEN_HEAD and (arch.is_mla or backend.name == "TRITON_ATTN"):
        width = arch.head_size + arch.head_size_v
        if dtype == "int4_per_token_head":
            width //= 2
        return width * s + 8  # two fp32 scales per token-head
    return (arch.head_size + arch.head_size_v) * s


@dataclass(frozen=True)
class BlockSizes:
    """The resolved logical block size, kernel block size and the Mamba page padding."""

    block_size: int
    kernel_block_size: int
    user_specified: bool
    hybrid_aligned: bool

    @property
    def ratio(self) -> int:
        """`r`: kernel blocks per logical block; NIXL transfers at kernel granularity."""
        return self.block_size // self.kernel_block_size


def resolve_block_size(
    plan: LaunchPlan, backend: Backend, token_unit: int, mamba_page: int, is_hybrid: bool
) -> BlockSizes:
    """§7.1/§7.3 of the reference: user or backend default, hybrid alignment, kernel split."""
    user = plan.block_size is not None
    if plan.block_size is not None:
        bs = plan.block_size
    elif backend.default_block_size != 16:
        bs = backend.default_block_size
    else:
        bs = 16 if backend.accepts(16) else backend.smallest()
    aligned = False
    if is_hybrid:
        align = max(backend.smallest(), bs)
        needed = align * cdiv(mamba_page, align * token_unit)
        aligned = needed > bs
        bs = max(bs, needed)
    return BlockSizes(bs, kernel_block_size(plan, backend, bs), user, aligned)


def kernel_block_size(plan: LaunchPlan, backend: Backend, bs: int) -> int:
    """`bs` if the backend has a kernel for it, else the largest kernel size that divides it."""
    if backend.accepts(bs):
        return bs
    fits = [s for s in backend.sizes if bs % s == 0]
    if fits:
        return max(fits)
    accepted = backend.sizes or (f"multiples of {backend.multiple_of}",)
    raise InputError(
        plan.name,
        [Problem("block_size", f"{bs} has no {backend.name} kernel (accepts {accepted})",
                 f"pick a block size {backend.name} supports, e.g. {backend.smallest()}")],
    )
