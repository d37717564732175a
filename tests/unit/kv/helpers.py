"""Shared builders for the KV tests: fixture configs and plans with the reference defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from narwhal.core.kv.geometry import Geometry, plan_geometry
from narwhal.core.kv.plan import LaunchPlan

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.config.json").read_text())
    return data


def geometry(fixture: str, model: str, **plan: Any) -> Geometry:
    return plan_geometry(config(fixture), LaunchPlan(model=model, **plan))
