"""An engine that cannot start says why in one line and exits non-zero, as vLLM does."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from narwhal.lab.engine.testing import engine_argv, free_port, write_model_dir

pytestmark = pytest.mark.timeout(60)


def launch(model: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(engine_argv(model, free_port(), args), capture_output=True, text=True,
                          timeout=30, check=False)


def test_an_unknown_flag_exits_2_naming_it(tiny_model: Path) -> None:
    done = launch(tiny_model, "--tensor-paralel-size", "2")
    assert done.returncode == 2
    assert "unrecognized arguments: --tensor-paralel-size" in done.stderr


def test_bad_kv_transfer_config_exits_2_naming_the_flag(tiny_model: Path) -> None:
    done = launch(tiny_model, "--kv-transfer-config", "{'kv_role': 'kv_both'}")
    assert done.returncode == 2
    assert "argument --kv-transfer-config: invalid JSON" in done.stderr


def test_a_missing_model_directory_exits_1(tmp_path: Path) -> None:
    done = launch(tmp_path / "nothing-here")
    assert done.returncode == 1
    assert "Engine failed to start: argument --model:" in done.stderr


def test_a_config_core_kv_rejects_exits_1_with_its_error(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path / "m", {
        "model_type": "llama", "vocab_size": 1000, "hidden_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2})
    done = launch(model, "-tp", "8")
    assert done.returncode == 1
    assert "TP 8 is invalid" in done.stderr and "tensor_parallel_size" in done.stderr


def test_a_taken_port_exits_1_naming_the_flag(tiny_model: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(engine_argv(tiny_model, port), capture_output=True, text=True,
                              timeout=30, check=False)
    assert done.returncode == 1
    assert f"argument --port: cannot bind 127.0.0.1:{port}" in done.stderr


def test_start_engine_picks_another_port_when_its_pick_is_taken_before_the_bind(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port can only say a port was free a moment ago; tiers running side by side take
    ports too. A port taken in between costs a second start, not a failed test."""
    from narwhal.lab.engine import testing

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy])
        real = testing.free_port
        monkeypatch.setattr(testing, "free_port", lambda host="127.0.0.1": next(picks, None)
                            or real(host))
        engine = testing.start_engine(tiny_model, log_path=tmp_path / "engine.log")
        try:
            assert engine.port != busy and testing.healthy(engine.port)
        finally:
            engine.stop()
