"""From a Hugging Face config.json dict to the architecture numbers vLLM hashes and sizes with.

vLLM reads the same config through its arch convertor; the rules mirrored here are the ones that
change KV bytes or hash factors: total KV heads, head size (MLA latent width), layer count,
model dtype, and whether the model is MLA. Layer kinds live in `layers.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from narwhal.core.errors import InputError, Problem
from narwhal.core.kv.layers import LayerKind, MambaDims, layer_kinds, positive_int

MLA_MODEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_mtp",
        "kimi_k2",
        "kimi_linear",
        "glm_moe_dsa",
        "glm4_moe_lite",
        "glm4_moe_lite_mtp",
        "longcat_flash",
        "longcat_flash_ngram",
        "pangu_ultra_moe",
        "pangu_ultra_moe_mtp",
        "axk1",
        "dots3_note",
        "k3_dspark",
    }
)
_KV_HEAD_KEYS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Arch:
    """Architecture numbers of one model, independent of how it is launched."""

    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    is_mla: bool
    config_dtype: str
    layers: tuple[LayerKind, ...]
    mamba: MambaDims | None

    @property
    def is_hybrid(self) -> bool:
        return any(k.is_mamba for k in self.layers)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal wrappers keep the language model under `text_config`; vLLM sizes from that."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping):
        merged = dict(inner)
        for key in ("torch_dtype", "dtype"):
            if key not in merged and key in config:
                merged[key] = config[key]
        return merged
    return config


def _int(cfg: Mapping[str, Any], key: str, problems: list[Problem]) -> int:
    return positive_int(cfg, key, problems)


def _first_present(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def config_dtype(cfg: Mapping[str, Any]) -> str:
    """The checkpoint dtype name as written (torch_dtype or dtype); float32 when absent."""
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    name = str(raw).removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def arch_from_config(config: Mapping[str, Any], source: str = "config.json") -> Arch:
    """Compute the architecture numbers, reporting every missing or bad field at once."""
    cfg = text_config(config)
    problems: list[Problem] = []
    model_type = str(cfg.get("model_type", ""))
    num_layers = _int(cfg, "num_hidden_layers", problems)
    heads = _int(cfg, "num_attention_heads", problems)
    is_mla = model_type in MLA_MODEL_TYPES and cfg.get("kv_lora_rank") is not None
    kv = _first_present(cfg, _KV_HEAD_KEYS)
    if kv is None:
        kv = heads
    if isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0:
        problems.append(Problem("num_key_value_heads", f"must be a positive integer, got {kv!r}",
                                "use the model's own config.json"))
        kv = 1
    if is_mla:
        head = _int(cfg, "kv_lora_rank", problems) + _int(cfg, "qk_rope_head_dim", problems)
        head_v = 0
    else:
        head = _head_size(cfg, heads, problems)
        head_v = head
    dtype = config_dtype(cfg)
    if dtype not in DTYPE_BYTES:
        problems.append(Problem("torch_dtype", f"{dtype!r} is not a float dtype vLLM serves",
                                "use bfloat16, float16 or float32"))
    kinds, mamba = layer_kinds(cfg, num_layers, is_mla, problems)
    if problems:
        raise InputError(source, problems)
    return Arch(model_type, num_layers, heads, kv, head, head_v, is_mla, dtype, kinds, mamba)


def _head_size(cfg: Mapping[str, Any], heads: int, problems: list[Problem]) -> int:
    # Qwen3 sets head_dim explicitly and it can differ from hidden/heads: prefer it.
    for key in ("head_dim", "hidden_size_per_head", "attention_head_dim"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    hidden = _int(cfg, "hidden_size", problems)
    return hidden // heads


def tp_problems(arch: Arch, tp: int) -> list[str]:
    """Why a tensor-parallel size cannot load this model; empty when it can."""
    reasons: list[str] = []
    if arch.num_attention_heads % tp:
        heads = arch.num_attention_heads
        reasons.append(f"num_attention_heads {heads} is not divisible by TP {tp}")
    k = arch.num_kv_heads
    if not arch.is_mla and k % tp and tp % k:
        reasons.append(
            f"num_key_value_heads {k} and TP {tp} do not divide each other "
            "(KV heads are either split evenly or replicated evenly)"
        )
    if arch.mamba is not None:
        reasons.extend(arch.mamba.tp_problems(tp))
    return reasons


def valid_tp_sizes(arch: Arch, limit: int = 64) -> list[int]:
    """Every TP size up to `limit` that loads the model: the fix offered when one does not."""
    return [tp for tp in range(1, limit + 1) if not tp_problems(arch, tp)]
