"""Per-layer kinds (full, sliding window, chunked local, MLA, Mamba1/Mamba2/GDN) from a config.

Kinds decide KV cache groups, how many blocks of a request cross the fabric and the name hashed
for the first layer, so every config convention vLLM honours for them is read here, and an
unfamiliar one is reported instead of being taken as full attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any, Literal

from narwhal.core.errors import Problem

Kind = Literal["full", "sliding", "chunked", "mla", "mamba1", "mamba2", "gdn"]
MAMBA_KINDS = ("mamba1", "mamba2", "gdn")
MAMBA_BACKEND = {"mamba1": "MAMBA1_ATTN", "mamba2": "MAMBA2_ATTN", "gdn": "GDN_ATTN"}


@dataclass(frozen=True)
class LayerKind:
    """One decoder layer that owns KV state; `window` is the sliding window or chunk size."""

    index: int
    kind: Kind
    window: int | None = None

    @property
    def is_mamba(self) -> bool:
        return self.kind in MAMBA_KINDS


@dataclass(frozen=True)
class MambaDims:
    """The recurrent-state dimensions of a hybrid's linear layers (mamba_utils.py shapes)."""

    kind: Kind
    conv_dim: int  # model-wide channels of the conv state (before the TP split)
    conv_kernel: int
    ssm_shape: tuple[int, ...]  # model-wide; first axis is split by TP
    split_dims: tuple[tuple[str, int], ...]  # (name, size) that must divide by TP
    n_groups: int = 0
    state_size: int = 0
    ssm_dtype_override: str | None = None

    def tp_problems(self, tp: int) -> list[str]:
        return [f"{name} {size} is not divisible by TP {tp}"
                for name, size in self.split_dims if size % tp]

    def conv_shape(self, tp: int, spec_tokens: int) -> tuple[int, int]:
        channels = self.conv_dim
        if self.kind == "mamba2" and self.n_groups % tp:
            # vLLM raises n_groups to tp so every rank holds one whole group.
            channels += 2 * (tp - self.n_groups) * self.state_size
        extra = 0 if self.kind == "mamba1" else spec_tokens
        return channels // tp, self.conv_kernel - 1 + extra

    def ssm_elements(self, tp: int) -> int:
        return prod(self.ssm_shape) // tp

    @property
    def conv_pieces(self) -> int:
        """Sub-projections read separately per block: x,B,C (Mamba2) or q,k,v (GDN); Mamba1 one."""
        return 1 if self.kind == "mamba1" else 3


def positive_int(cfg: Mapping[str, Any], key: str, problems: list[Problem],
                 context: str = "") -> int:
    """A config.json field that must be a positive integer; a problem (and 1) otherwise."""
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        problems.append(Problem(key, f"must be a positive integer{context}, got {value!r}",
                                "use the model's own config.json"))
        return 1
    return value


def _pos(cfg: Mapping[str, Any], key: str, problems: list[Problem]) -> int:
    return positive_int(cfg, key, problems, " for this hybrid")


def mamba_dims(cfg: Mapping[str, Any], kind: Kind, problems: list[Problem]) -> MambaDims:
    """Read the state dimensions for one linear-layer kind."""
    if kind == "gdn":
        hk = _pos(cfg, "linear_num_key_heads", problems)
        dk = _pos(cfg, "linear_key_head_dim", problems)
        hv = _pos(cfg, "linear_num_value_heads", problems)
        dv = _pos(cfg, "linear_value_head_dim", problems)
        return MambaDims(
            "gdn", 2 * hk * dk + hv * dv, _pos(cfg, "linear_conv_kernel_dim", problems),
            (hv, dv, dk), (("linear_num_key_heads", hk), ("linear_num_value_heads", hv)),
            ssm_dtype_override=cfg.get("mamba_ssm_dtype"),
        )
    if kind == "mamba2":
        nh, hd = _pos(cfg, "mamba_num_heads", problems), _pos(cfg, "mamba_head_dim", problems)
        groups, state = _pos(cfg, "n_groups", problems), _pos(cfg, "ssm_state_size", problems)
        return MambaDims(
            "mamba2", nh * hd + 2 * groups * state, _pos(cfg, "conv_kernel", problems),
            (nh, hd, state), (("mamba_num_heads", nh),), n_groups=groups, state_size=state,
            # NemotronH keeps the temporal state in float32 unless the config says otherwise.
            ssm_dtype_override=str(cfg.get("mamba_ssm_cache_dtype") or "float32"),
        )
    inner = _pos(cfg, "mamba_expand", problems) * _pos(cfg, "hidden_size", problems)
    return MambaDims(
        "mamba1", inner, _pos(cfg, "mamba_d_conv", problems),
        (inner, _pos(cfg, "mamba_d_state", problems)), (("mamba intermediate size", inner),),
    )


def _sliding_window(cfg: Mapping[str, Any]) -> int | None:
    if cfg.get("model_type") == "qwen2" and not cfg.get("use_sliding_window", False):
        return None  # the HF Qwen2 class nulls the window unless use_sliding_window is set
    window = cfg.get("sliding_window")
    return window if isinstance(window, int) and window > 0 else None


def _type_list(cfg: Mapping[str, Any], n: int) -> list[str] | None:
    """One type word per layer from whichever convention the config uses, or None."""
    if isinstance(cfg.get("layer_types"), list):
        return [str(t) for t in cfg["layer_types"]]
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        table = {"M": "mamba", "*": "full_attention", "-": "none", "E": "none"}
        return [table.get(c, f"unknown pattern char {c!r}") for c in cfg["hybrid_override_pattern"]]
    if isinstance(cfg.get("layers_block_type"), list):
        return ["full_attention" if t == "attention" else str(t) for t in cfg["layers_block_type"]]
    if isinstance(cfg.get("attn_layer_period"), int) and "attn_layer_offset" in cfg:
        period, offset = cfg["attn_layer_period"], cfg["attn_layer_offset"]
        return ["full_attention" if i % period == offset else "mamba" for i in range(n)]
    if isinstance(cfg.get("full_attention_interval"), int):
        step = cfg["full_attention_interval"]
        return ["full_attention" if (i + 1) % step == 0 else "linear_attention" for i in range(n)]
    return None


def _linear_kind(cfg: Mapping[str, Any]) -> Kind:
    if "linear_num_value_heads" in cfg:
        return "gdn"
    if "mamba_num_heads" in cfg:
        return "mamba2"
    return "mamba1"


def layer_kinds(
    cfg: Mapping[str, Any], n: int, is_mla: bool, problems: list[Problem]
) -> tuple[tuple[LayerKind, ...], MambaDims | None]:
    """Every KV-owning layer with its kind; layers without KV (MLP-only, KV-shared) are left out."""
    if is_mla:
        return tuple(LayerKind(i, "mla") for i in range(n)), None
    types = _type_list(cfg, n)
    window = _sliding_window(cfg)
    chunk = cfg.get("attention_chunk_size")
    if types is None:
        if isinstance(chunk, int) and chunk > 0:
            ropes = cfg.get("no_rope_layers")
            flags = ropes if isinstance(ropes, list) else [(i + 1) % 4 != 0 for i in range(n)]
            return tuple(LayerKind(i, "chunked", chunk) if flags[i] else LayerKind(i, "full")
                         for i in range(n)), None
        if window is not None:
            return tuple(LayerKind(i, "sliding", window) for i in range(n)), None
        return tuple(LayerKind(i, "full") for i in range(n)), None
    return _typed_layers(cfg, types, n, window, problems)


def _typed_layers(
    cfg: Mapping[str, Any], types: list[str], n: int, window: int | None,
    problems: list[Problem],
) -> tuple[tuple[LayerKind, ...], MambaDims | None]:
    if len(types) != n:
        problems.append(Problem("layer_types",
                                f"lists {len(types)} layers, num_hidden_layers is {n}",
                                "use the model's own config.json"))
    linear = _linear_kind(cfg)
    out: list[LayerKind] = []
    for i, word in enumerate(types):
        if word in ("full_attention", "attention", "hybrid"):
            out.append(LayerKind(i, "full"))
        elif word == "sliding_attention":
            if window is None:
                problems.append(Problem("sliding_window",
                                        f"layer {i} is sliding but no window is set",
                                        "set sliding_window in config.json"))
            out.append(LayerKind(i, "sliding", window))
        elif word in ("mamba", "linear_attention"):
            out.append(LayerKind(i, linear))
        elif word != "none":
            problems.append(Problem(f"layer_types[{i}]", f"{word!r} is not a modelled layer kind",
                                    "Narwhal models full, sliding, chunked, MLA, Mamba1/2 and GDN"))
    dims = mamba_dims(cfg, linear, problems) if any(k.is_mamba for k in out) else None
    return tuple(out), dims
