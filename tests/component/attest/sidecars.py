"""One emulator engine started by `narwhal-engine` (native runtime) from a launch record, and
its real `narwhal-attest serve` sidecar on loopback, for the attestation component tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.core import result_line
from narwhal.lab.engine.testing import free_port, write_tiny_llama
from tests.native_engine import engine, launch_record, start

ENTRYPOINT = [sys.executable, "-m", "narwhal.lab.engine", "serve"]


@dataclass
class EngineWithSidecar:
    run_dir: Path
    engine_port: int
    port: int  # the sidecar's
    layout: dict[str, Any]  # Gate C's capture of the engine


def serve(run_dir: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "narwhal.node.attest_cli", "serve",
                             "--run-dir", str(run_dir), "--deployment", "t", "--bind",
                             "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextmanager
def engine_with_sidecar(root: Path) -> Iterator[EngineWithSidecar]:
    model = write_tiny_llama(root / "tiny")
    http_port, attest_port = free_port(), free_port()
    launch_record(root / "e0.json", "e0", entrypoint=ENTRYPOINT, model=model, served="tiny",
                  http=http_port, side=free_port(), attest=attest_port,
                  vllm_args=["--dtype", "float32", "--kv-cache-memory-bytes", "64M"],
                  environment={})
    run_dir = root / "e0"
    sidecar: subprocess.Popen[str] | None = None
    try:
        layout = start(root / "e0.json", run_dir)
        sidecar = serve(run_dir, attest_port)
        assert sidecar.stdout is not None
        started = result_line.parse(sidecar.stdout.readline(), "narwhal-attest serve")
        assert started.ok, started.error
        yield EngineWithSidecar(run_dir, http_port, attest_port, layout)
    finally:
        if sidecar is not None:
            sidecar.terminate()
            sidecar.wait(timeout=10)
        engine("stop", "--run-dir", str(run_dir))


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
