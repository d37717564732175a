"""Per-layer KV cache specs on one rank: page bytes, bytes per token and real Mamba state bytes.

A page is the bytes one layer stores for one logical block on one rank. Hybrids pad Mamba pages
up to the attention page, but NIXL reads only the real conv and temporal state bytes, so both
are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from narwhal.core.kv.arch import DTYPE_BYTES, Arch
from narwhal.core.kv.blocks import model_dtype
from narwhal.core.kv.layers import Kind, LayerKind, MambaDims
from narwhal.core.kv.plan import LaunchPlan


@dataclass(frozen=True)
class LayerSpec:
    """One KV-owning layer's spec as vLLM groups it."""

    layer: int
    kind: Kind
    window: int | None
    page: int
    bytes_per_token: int  # attention only; 0 for Mamba
    conv_bytes: int = 0
    ssm_bytes: int = 0

    @property
    def bucket_key(self) -> tuple[str, int | None, int]:
        return (self.kind, self.window, self.page)


@dataclass(frozen=True)
class MambaState:
    """Real bytes of one Mamba layer's state on one rank."""

    conv_bytes: int
    ssm_bytes: int

    @property
    def total(self) -> int:
        return self.conv_bytes + self.ssm_bytes


def mamba_state(arch: Arch, plan: LaunchPlan, dims: MambaDims, tp: int) -> MambaState:
    """Conv and temporal state bytes per rank, with the dtype rules of mamba_utils.py."""
    base = model_dtype(arch, plan)
    conv_dtype = base if plan.mamba_cache_dtype == "auto" else plan.mamba_cache_dtype
    if plan.mamba_ssm_cache_dtype != "auto":
        ssm_dtype = plan.mamba_ssm_cache_dtype
    elif dims.ssm_dtype_override:
        ssm_dtype = str(dims.ssm_dtype_override).removeprefix("torch.")
    else:
        ssm_dtype = conv_dtype
    spec_tokens = plan.speculative.num_speculative_tokens if plan.speculative else 0
    conv = prod(dims.conv_shape(tp, spec_tokens)) * DTYPE_BYTES[conv_dtype]
    ssm = dims.ssm_elements(tp) * DTYPE_BYTES.get(ssm_dtype, 4)
    return MambaState(conv, ssm)


def layer_specs(
    layers: tuple[LayerKind, ...], token_unit: int, block_size: int, state: MambaState | None,
) -> tuple[LayerSpec, ...]:
    """Specs after page unification: attention at the resolved block size, Mamba padded to it."""
    page = block_size * token_unit
    out: list[LayerSpec] = []
    for layer in layers:
        if layer.is_mamba and state is not None:
            out.append(LayerSpec(layer.index, layer.kind, None, max(page, state.total), 0,
                                 state.conv_bytes, state.ssm_bytes))
        else:
            out.append(LayerSpec(layer.index, layer.kind, layer.window, page, token_unit))
    return tuple(out)
