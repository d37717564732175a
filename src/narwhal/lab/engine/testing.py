"""Helpers for every test tier and for other helpers: model directories and running emulators.

`write_tiny_llama(dir)` writes the real tier's tiny model config (vocab 432, hidden 128, 2
layers, 4 heads, 2 KV heads, head_dim 32); `write_llama3_8b(dir)` a Llama-3-8B-shaped one.
`start_engine(model_dir, ...)` spawns `python -m narwhal.lab.engine serve ...` on loopback,
waits (bounded) for /health and returns a `RunningEngine` that stops its own process by PID.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.lab.engine import hf_tokenizer
from narwhal.lab.ports import free_port

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 432,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 2048, "torch_dtype": "float32", "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
}
LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "bos_token_id": 128000, "eos_token_id": 128001, "rope_theta": 500000.0,
}
START_TIMEOUT = 30.0


# Qwen3-Next's shape at toy size: GDN (linear attention) layers 0-2, full attention at layer 3,
# a hybrid checkpoint whose conv state NIXL hands over only in the DS layout.
TINY_QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 432,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "full_attention_interval": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 32,
    "linear_num_value_heads": 4, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 2048, "torch_dtype": "float32", "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
}


def write_model_dir(path: Path, config: Mapping[str, Any],
                    tokenizer_config: Mapping[str, Any] | None = None) -> Path:
    """A model directory: config.json, tokenizer_config.json (the given keys, and the chat
    template) and the tokenizer.json that encodes as the emulator does (hf_tokenizer.py)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(dict(config), indent=1))
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(dict(tokenizer_config), indent=1))
    hf_tokenizer.write(path)
    return path


def write_tiny_llama(path: Path) -> Path:
    return write_model_dir(path, TINY_LLAMA, {"bos_token": "<s>", "eos_token": "</s>",
                                              "pad_token": "<pad>", "add_bos_token": True})


def write_llama3_8b(path: Path) -> Path:
    return write_model_dir(path, LLAMA3_8B, {"bos_token": "<|begin_of_text|>",
                                             "eos_token": "<|end_of_text|>"})


class EngineStartFailed(RuntimeError):
    """The emulator exited or did not become healthy; carries its log tail."""


@dataclass
class RunningEngine:
    """One emulator process started by this test run."""

    url: str
    port: int
    pid: int
    log_path: Path
    side_channel_port: int
    process: subprocess.Popen[bytes] = field(repr=False)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM this engine's PID, SIGKILL after `timeout`; its exit status."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout=timeout)
        return self.process.returncode


def engine_argv(model_dir: Path, port: int, extra_args: Sequence[str] = (),
                host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "narwhal.lab.engine", "serve", str(model_dir),
            "--host", host, "--port", str(port), *extra_args]


def healthy(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """GET /health answered 200 within `timeout`."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


PORT_TRIES = 3  # a port free a moment ago can be taken before the engine binds it


def start_engine(model_dir: Path, *, log_path: Path, port: int | None = None,
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 timeout: float = START_TIMEOUT) -> RunningEngine:
    """Spawn an emulator on 127.0.0.1 and wait for /health; EngineStartFailed with its log.
    Ports it picks itself are picked again when another process took one first (free_port
    can only say a port was free; tiers running side by side bind ports too)."""
    if port is None and "VLLM_NIXL_SIDE_CHANNEL_PORT" not in (env or {}):
        for _ in range(PORT_TRIES - 1):
            try:
                return _spawn(model_dir, log_path=log_path, port=free_port(),
                              extra_args=extra_args, env=env, timeout=timeout)
            except EngineStartFailed as exc:
                if "address already in use" not in str(exc) and "Errno 98" not in str(exc):
                    raise
    return _spawn(model_dir, log_path=log_path, port=port or free_port(),
                  extra_args=extra_args, env=env, timeout=timeout)


def _spawn(model_dir: Path, *, log_path: Path, port: int, extra_args: Sequence[str],
           env: Mapping[str, str] | None, timeout: float) -> RunningEngine:
    full_env = dict(os.environ)
    full_env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())  # one per engine, unless given
    full_env.update(env or {})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(engine_argv(model_dir, port, extra_args), stdout=log,
                                   stderr=subprocess.STDOUT, env=full_env,
                                   stdin=subprocess.DEVNULL)
    engine = RunningEngine(url=f"http://127.0.0.1:{port}", port=port, pid=process.pid,
                           log_path=log_path,
                           side_channel_port=int(full_env["VLLM_NIXL_SIDE_CHANNEL_PORT"]),
                           process=process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineStartFailed(f"emulator exited with {process.returncode}:\n"
                                    f"{engine.log_text()[-4000:]}")
        if healthy(port):
            return engine
        time.sleep(0.05)
    engine.stop()
    raise EngineStartFailed(f"emulator not healthy after {timeout:.0f}s:\n"
                            f"{engine.log_text()[-4000:]}")


@contextlib.contextmanager
def running_engine(model_dir: Path, *, log_path: Path, port: int | None = None,
                   extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                   timeout: float = START_TIMEOUT) -> Iterator[RunningEngine]:
    """`start_engine` as a context manager: the process is stopped on the way out."""
    engine = start_engine(model_dir, log_path=log_path, port=port, extra_args=extra_args,
                          env=env, timeout=timeout)
    try:
        yield engine
    finally:
        engine.stop()
