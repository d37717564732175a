"""Shared builders for the emulator's unit tests: model dirs and parsed configs."""

from __future__ import annotations

from pathlib import Path

from narwhal.lab.engine.config import EngineConfig, parse_config
from narwhal.lab.engine.engine_plan import EnginePlan, build_plan
from narwhal.lab.engine.model_dir import load_model_dir
from narwhal.lab.engine.testing import write_llama3_8b, write_tiny_llama


def tiny(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "tiny-llama")


def llama8b(tmp_path: Path) -> Path:
    return write_llama3_8b(tmp_path / "llama-3-8b")


def config(model_dir: Path, *flags: str, env: dict[str, str] | None = None) -> EngineConfig:
    return parse_config(["serve", str(model_dir), *flags], env or {})


def plan(model_dir: Path, *flags: str, env: dict[str, str] | None = None) -> EnginePlan:
    cfg = config(model_dir, *flags, env=env)
    return build_plan(cfg, load_model_dir(cfg.model_dir))
