"""The emulator passes the same fidelity checks as real vLLM 0.32.0 (tests/real runs them there).

Two emulators are launched like the real tier's pair (tiny Llama, `kv_both` NixlConnector,
`kv_buffer_device: cpu`, float32, 512-token context, 64 MiB of KV, CPU platform, vLLM 0.32.0),
and every check in tests/fidelity/checks.py runs against them unchanged. A failure message
lists each key, label or shape that differs from the captured real replies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from narwhal.lab.engine.testing import RunningEngine, start_engine, write_tiny_llama
from tests.fidelity import checks
from tests.fidelity.requests import SERVED_NAME

KV_CONFIG = ('{"kv_connector": "NixlConnector", "kv_role": "kv_both", '
             '"kv_buffer_device": "cpu"}')
ARGS = ("--served-model-name", SERVED_NAME, "--dtype", "float32", "--max-model-len", "512",
        "--kv-cache-memory-bytes", "67108864", "--enforce-eager",
        "--kv-transfer-config", KV_CONFIG,
        "--emu-vllm-version", "0.32.0", "--emu-platform", "cpu", "--emu-zero-delay")


@pytest.fixture(scope="module")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningEngine, ...]]:
    root = tmp_path_factory.mktemp("fidelity-emulators")
    model = write_tiny_llama(root / "tiny-llama")
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "UCX_TLS": "tcp,self"}
    started: list[RunningEngine] = []
    try:
        for name in ("prefill", "decode"):
            started.append(start_engine(model, log_path=root / f"{name}.log",
                                        extra_args=ARGS, env=env))
        yield tuple(started)
    finally:
        for engine in started:
            engine.stop()


def _name(check: Callable[..., Any]) -> str:
    return check.__name__.removeprefix("check_")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("check", checks.SINGLE_ENGINE_CHECKS, ids=_name)
def test_emulator_passes_single_engine_fidelity_check(
    emulators: tuple[RunningEngine, ...], check: Callable[[str], Any]
) -> None:
    check(emulators[0].url)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("check", checks.PAIR_CHECKS, ids=_name)
def test_emulator_pair_passes_pair_fidelity_check(
    emulators: tuple[RunningEngine, ...], check: Callable[[str, str], Any]
) -> None:
    check(emulators[0].url, emulators[1].url)
