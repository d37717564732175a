"""KV cache groups (kv_cache_utils.get_kv_cache_groups) and the regions NIXL registers.

Groups share one allocation and alias from byte 0, so layer j of every group lives in region j:
a model with g groups of n layers registers n regions, not g*n. That is why the region count and
block_lens of a hybrid differ from its layer count, and why the prediction needs the grouping.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.core.kv.blocks import cdiv
from narwhal.core.kv.layers import LayerKind
from narwhal.core.kv.specs import LayerSpec

_LOCAL_KINDS = ("sliding", "chunked")


@dataclass(frozen=True)
class Group:
    """One KV cache group: a spec kind and the layers (model indices) it holds."""

    kind: str
    window: int | None
    page: int
    layers: tuple[int, ...]

    @property
    def is_mamba(self) -> bool:
        return self.kind in ("mamba1", "mamba2", "gdn")


def promote_without_hma(layers: tuple[LayerKind, ...], hma: bool) -> tuple[LayerKind, ...]:
    """With HMA off, sliding/chunked layers mixed with full ones are allocated as full attention."""
    if hma or not any(k.kind == "full" for k in layers):
        return layers
    return tuple(LayerKind(k.index, "full") if k.kind in _LOCAL_KINDS else k for k in layers)


def build_groups(specs: tuple[LayerSpec, ...]) -> tuple[Group, ...]:
    """Bucket layers by spec, size groups, and hand layers out in strided order."""
    buckets: dict[tuple[str, int | None, int], list[int]] = {}
    for spec in specs:
        buckets.setdefault(spec.bucket_key, []).append(spec.layer)
    if not buckets:
        return ()
    if len(buckets) == 1:
        (kind, window, page), layers = next(iter(buckets.items()))
        return (Group(kind, window, page, tuple(layers)),)
    sizes = [len(v) for v in buckets.values()]
    small, large = min(sizes), max(sizes)
    group_size = large if large < 1.5 * small else small
    groups: list[Group] = []
    for (kind, window, page), layers in buckets.items():
        count = cdiv(len(layers), group_size)
        for i in range(count):
            groups.append(Group(kind, window, page, tuple(layers[i::count])))
    return tuple(groups)


def stage_layer_range(num_layers: int, pp: int, stage: int) -> range:
    """vLLM's default PP split: floor(L/pp) each, the remainder one each to the earlier stages."""
    base, extra = divmod(num_layers, pp)
    sizes = [base + (1 if i < extra and i < pp - 1 else 0) for i in range(pp)]
    sizes[-1] += num_layers - sum(sizes)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])
