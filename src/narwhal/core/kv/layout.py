"""KV cache layout resolution (kv_cache_layout.py): which 5-letter stride order an engine picks.

Layout must be equal on both sides of a non-MLA transfer and block-contiguous for heterogeneous
TP. It is resolved from backend declarations, an explicit override and the connector's
preference, in that order, so a backend that cannot do LBHNC silently changes it.
"""

from __future__ import annotations

from collections import Counter

from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.backends import LAYER_OUTERMOST_DEFAULT, Backend

BLOCK_COMPACT = frozenset({"LBHNC", "LBNHC", "BLHNC", "BLNHC"})
BLOCK_CONTIGUOUS = frozenset({"LBHNC", "BLHNC"})
BLOCK_OUTERMOST = frozenset({"BLHNC", "BLNHC", "BHLNC"})
NIXL_PREFERRED = "LBHNC"


def candidates(backends: tuple[Backend, ...], mixed_shapes: bool) -> list[str]:
    """Layouts every backend accepts, ranked by how many backends list each first."""
    declared = [b.layouts for b in backends if b.layouts is not None]
    if not declared:
        ranked = list(LAYER_OUTERMOST_DEFAULT)
    elif len(set(declared)) == 1:
        ranked = list(declared[0])
    else:
        common = set(declared[0]).intersection(*declared[1:])
        firsts = Counter(d[0] for d in declared)
        order = {name: i for i, name in enumerate(declared[0])}
        ranked = sorted(common, key=lambda n: (-firsts[n], order.get(n, 99)))
    if mixed_shapes:
        ranked = [n for n in ranked if n in BLOCK_COMPACT]
    return ranked


def resolve_layout(
    engine: str, backends: tuple[Backend, ...], override: str | None, is_mla: bool,
    mixed_shapes: bool,
) -> tuple[str, str]:
    """(layout, why): override, else NIXL's LBHNC for non-MLA, else the first candidate."""
    ranked = candidates(backends, mixed_shapes)
    if not ranked:
        raise InputError(engine, [Problem("attention_backend", "the backends share no KV layout",
                                          "use backends that declare a common layout")])
    if override is not None:
        if override not in ranked:
            raise InputError(engine, [Problem(
                "kv_cache_layout",
                f"{override} is not allowed by the backends ({', '.join(ranked)})",
                f"unset VLLM_KV_CACHE_LAYOUT or choose one of {', '.join(ranked)}")])
        return override, "VLLM_KV_CACHE_LAYOUT override"
    if not is_mla:
        if NIXL_PREFERRED in ranked:
            return NIXL_PREFERRED, "NixlConnector preference"
        return ranked[0], f"backend cannot use {NIXL_PREFERRED}; first allowed layout wins"
    return ranked[0], "MLA: connector states no preference"
