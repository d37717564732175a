"""The launch plan: the vLLM arguments that decide KV geometry and the compatibility hash.

Strict and closed (unknown keys are refused): a misspelt `block_sise` would otherwise fall back
to the default and predict a geometry the engine never allocates.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from narwhal.core.document_io import StrictModel
from narwhal.core.kv.versions import facts_for

LAYOUT_NAMES = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
LAYOUT_ALIASES = {"HND": "LBHNC", "NHD": "LBNHC"}

# kv_cache_dtype -> bytes per element; "auto" follows the model dtype.
KV_DTYPE_BYTES: dict[str, int] = {
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_ds_mla": 1,
    "fp8_per_token_head": 1,
    "int8_per_token_head": 1,
    "int4_per_token_head": 1,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
}
KV_CACHE_DTYPES = ("auto", *KV_DTYPE_BYTES)
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32")
MAMBA_DTYPES = ("auto", "bfloat16", "float16", "float32")


class SpeculativePlan(StrictModel):
    """`--speculative-config`: only EAGLE/MTP-style methods reach the hash."""

    method: str
    model: str | None = None
    revision: str | None = None
    code_revision: str | None = None
    parallel_drafting: bool = False
    kv_cache_dtype: str | None = None
    auxiliary_layer_ids: list[int] | None = None
    num_speculative_tokens: int = Field(default=0, ge=0)


class LaunchPlan(StrictModel):
    """How one engine is launched, as far as its KV cache and handshake are concerned."""

    name: str = Field(default="engine", min_length=1)
    vllm_version: str = "0.29.0"
    model: str = Field(min_length=1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)
    block_size: int | None = Field(default=None, ge=1)
    kv_cache_dtype: str = "auto"
    attention_backend: str | None = None
    kv_cache_layout: str | None = None
    transfer_mode: Literal["pull", "push"] = "pull"
    disable_hybrid_kv_cache_manager: bool | None = None
    enable_prefix_caching: bool = True
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_mode: Literal["none", "align"] = "none"
    ssm_conv_state_layout: Literal["SD", "DS"] = "SD"
    speculative: SpeculativePlan | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    available_kv_bytes: int | None = Field(default=None, ge=1)

    @field_validator("vllm_version")
    @classmethod
    def _known_release(cls, value: str) -> str:
        try:
            facts_for(value)
        except Exception as exc:  # ContractError -> a field problem with the same text
            raise ValueError(str(exc)) from None
        return value

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, value: str) -> str:
        if value not in KV_CACHE_DTYPES:
            raise ValueError(f"{value!r} is not modelled; use one of {', '.join(KV_CACHE_DTYPES)}")
        return value

    @field_validator("mamba_cache_dtype", "mamba_ssm_cache_dtype")
    @classmethod
    def _mamba_dtype(cls, value: str) -> str:
        if value not in MAMBA_DTYPES:
            raise ValueError(f"{value!r} is not modelled; use one of {', '.join(MAMBA_DTYPES)}")
        return value

    @field_validator("kv_cache_layout")
    @classmethod
    def _layout(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name = LAYOUT_ALIASES.get(value, value)
        if name not in LAYOUT_NAMES:
            allowed = ", ".join((*LAYOUT_NAMES, *LAYOUT_ALIASES))
            raise ValueError(f"{value!r} is not a vLLM KV cache layout; use one of {allowed}")
        return name
