"""Emulator engines started by `narwhal-engine` (native runtime) from launch records, and their
real `narwhal-attest serve` sidecars on loopback, for the attestation component tests: one
engine with its sidecar, or several engines whose sidecars also keep the controller lease."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.core import result_line
from narwhal.lab.engine.testing import free_port, write_tiny_llama
from tests.native_engine import engine, launch_record, start

ENTRYPOINT = [sys.executable, "-m", "narwhal.lab.engine", "serve"]
DEPLOYMENT = "t"


@dataclass
class EngineWithSidecar:
    run_dir: Path
    engine_port: int
    port: int  # the sidecar's
    layout: dict[str, Any]  # Gate C's capture of the engine


@dataclass
class Sidecar:
    """One running `narwhal-attest serve` process, stopped by its own pid."""

    run_dir: Path
    port: int
    proc: subprocess.Popen[str]
    started: dict[str, Any] = field(default_factory=dict)  # its result line's data
    paused: bool = False
    stderr: str = ""  # what it wrote there, once stopped

    @property
    def lease_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/lease"

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.paused:
                self.resume()  # a stopped process would hold SIGTERM until continued
            self.proc.terminate()
        try:
            _, self.stderr = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate(timeout=10)


def serve(run_dir: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "narwhal.node.attest_cli", "serve",
                             "--run-dir", str(run_dir), "--deployment", DEPLOYMENT, "--bind",
                             "127.0.0.1", "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_sidecar(run_dir: Path, port: int | None = None,
                  lease_key_file: Path | None = None) -> Sidecar:
    """A sidecar that has printed its passing result line (it listens from then on)."""
    port = port or free_port()
    extra = ("--lease-key-file", str(lease_key_file)) if lease_key_file is not None else ()
    sidecar = Sidecar(run_dir, port, serve(run_dir, port, *extra))
    assert sidecar.proc.stdout is not None
    try:
        started = result_line.parse(sidecar.proc.stdout.readline(), "narwhal-attest serve")
        assert started.ok, started.error
    except BaseException:
        sidecar.stop()
        raise
    sidecar.started = dict(started.data)
    return sidecar


@contextmanager
def emulator_engine(root: Path, name: str = "e0") -> Iterator[EngineWithSidecar]:
    """One engine, prepared, checked, started and captured; its sidecar port is reserved in
    the launch record but nothing listens there yet."""
    model = root / "tiny"
    if not model.exists():
        write_tiny_llama(model)
    http_port, attest_port = free_port(), free_port()
    launch_record(root / f"{name}.json", name, entrypoint=ENTRYPOINT, model=model, served="tiny",
                  http=http_port, side=free_port(), attest=attest_port,
                  vllm_args=["--dtype", "float32", "--kv-cache-memory-bytes", "64M"],
                  environment={})
    run_dir = root / name
    try:
        layout = start(root / f"{name}.json", run_dir)
        yield EngineWithSidecar(run_dir, http_port, attest_port, layout)
    finally:
        engine("stop", "--run-dir", str(run_dir))


@contextmanager
def engine_with_sidecar(root: Path, name: str = "e0",
                        lease_key_file: Path | None = None) -> Iterator[EngineWithSidecar]:
    with emulator_engine(root, name) as e:
        sidecar = start_sidecar(e.run_dir, e.port, lease_key_file)
        try:
            yield e
        finally:
            sidecar.stop()


@contextmanager
def emulator_engines(root: Path, count: int) -> Iterator[list[EngineWithSidecar]]:
    """`count` engines (e0, e1, ...), each stopped on the way out even if a later one fails."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(emulator_engine(root, f"e{i}")) for i in range(count)]


def write_key(path: Path, key: str, mode: int = 0o600) -> Path:
    """The controller key file both the sidecars and the router read."""
    path.write_text(key + "\n")
    path.chmod(mode)
    return path


@dataclass
class Attested:
    root: Path
    run_dir: Path
    engine_url: str
    attestation_url: str
    document: dict[str, Any]

    def fleet(self, **contract: str) -> Path:
        path = self.root / "fleet.json"
        path.write_text(json.dumps({
            "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
            "engines": [{"id": "e0", "url": self.engine_url, "role": "both",
                         "attestation_url": self.attestation_url, "contract": {
                             "compatibility_hash": self.document["compatibility_hash"],
                             "launch_record_sha256": self.document["launch_record_sha256"],
                             "attestation_digest": self.document["digest"], **contract}}],
            "slo": {"ttft_s": 5.0, "tpot_s": 1.0}, "journal": {"path": "journal.jsonl"},
            "health": {"probe_interval_s": 0.3, "probe_timeout_s": 2.0}}))
        return path
