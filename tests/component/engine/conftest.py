"""Component fixtures: real emulator processes on loopback, always stopped by PID afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from narwhal.lab.engine.testing import RunningEngine, start_engine, write_tiny_llama

StartEngine = Callable[..., RunningEngine]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture
def engines(tiny_model: Path, tmp_path: Path) -> Iterator[StartEngine]:
    """Start emulators for one test: `engines("--max-num-seqs", "2", env={...})`."""
    started: list[RunningEngine] = []

    def start(*args: str, env: dict[str, str] | None = None,
              model: Path | None = None) -> RunningEngine:
        engine = start_engine(model or tiny_model, extra_args=args, env=env,
                              log_path=tmp_path / f"engine-{len(started)}.log")
        started.append(engine)
        return engine

    try:
        yield start
    finally:
        for engine in started:
            engine.stop()
