"""A small fleet of kv_both emulators for narwhal-check tests, and ways to run the check on it.

Timing model on, with small values the hand-written profile rows repeat exactly, so the pace
gate compares a real measurement with a prediction that is right for a healthy engine.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.lab.engine.testing import RunningEngine, start_engine, write_tiny_llama
from narwhal.serve.router.scheduling.generation import parse_start_time, parse_version

KV_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
PREFILL_A, PREFILL_B = 0.02, 1e-5
DECODE_BASE, DECODE_PER_TOKEN, DECODE_PER_REQUEST = 0.004, 1e-7, 1e-3
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-transfer-config", KV_BOTH, "--emu-platform",
               "cpu", "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "64M",
               "--emu-prefill-a", str(PREFILL_A), "--emu-prefill-b", str(PREFILL_B),
               "--emu-prefill-c", "0", "--emu-decode-base", str(DECODE_BASE),
               "--emu-decode-per-token", str(DECODE_PER_TOKEN),
               "--emu-decode-per-request", str(DECODE_PER_REQUEST)]
ENV = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def fault(engine: RunningEngine, name: str, **fields: Any) -> None:
    status, body = call(engine.port, "POST", "/emu/fault", {"fault": name, **fields})
    assert status == 200, body


def live_generation(port: int) -> dict[str, Any]:
    return {"engine_version": parse_version(call(port, "GET", "/version")[1]),
            "process_start_time_seconds": parse_start_time(call(port, "GET", "/metrics")[1])}


def profile_row(engine_id: str, port: int) -> dict[str, Any]:
    """A row with the emulator's own timing model and its live generation."""
    return {"engine_id": engine_id, "generation": live_generation(port),
            "prefill": {"a_s": PREFILL_A, "b_s_per_token": PREFILL_B, "c_s_per_token2": 0.0,
                        "fit_error": 0.02, "loo_error": 0.03, "samples": 12,
                        "max_prompt_tokens": 256},
            "decode": {"base_s": DECODE_BASE, "per_token_s": DECODE_PER_TOKEN,
                       "per_request_s": DECODE_PER_REQUEST,
                       "fit_error": 0.03, "loo_error": 0.04, "samples": 24, "max_requests": 16,
                       "max_resident_tokens": 8192},
            "measured_at": "2026-11-30T12:00:00+00:00"}


@dataclass
class CheckFleet:
    root: Path
    model_dir: Path
    engines: dict[str, RunningEngine]

    @property
    def fleet_path(self) -> Path:
        return self.root / "fleet.json"

    def write_fleet(self, **sections: Any) -> Path:
        doc: dict[str, Any] = {
            "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
            "engines": [{"id": eid, "url": e.url, "role": "both"} for eid, e in self.engines.items()],
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "journal.jsonl"},
            "profiles": {"path": "profiles.json"}}
        doc.update(sections)
        self.fleet_path.write_text(json.dumps(doc, indent=1))
        return self.fleet_path

    def write_profiles(self, rows: Sequence[dict[str, Any]] | None = None) -> Path:
        path = self.root / "profiles.json"
        rows = rows if rows is not None else [profile_row(eid, e.port)
                                              for eid, e in self.engines.items()]
        path.write_text(json.dumps({"schema": "narwhal.profiles", "schema_version": 1,
                                    "model": "tiny", "profiles": list(rows)}))
        return path

    def restart(self, engine_id: str) -> RunningEngine:
        """Stop an engine and start a new process on the same port (a new generation)."""
        old = self.engines[engine_id]
        old.stop()
        new = start_engine(self.model_dir, log_path=self.root / f"{engine_id}-again.log",
                           port=old.port, extra_args=ENGINE_ARGS, env=ENV)
        self.engines[engine_id] = new
        return new

    def clear_faults(self) -> None:
        for e in self.engines.values():
            if e.alive():
                fault(e, "clear")


@contextmanager
def check_fleet(root: Path, ids: Sequence[str] = ("e0", "e1", "e2")) -> Iterator[CheckFleet]:
    model_dir = write_tiny_llama(root / "tiny")
    fleet = CheckFleet(root, model_dir, {})
    try:
        for eid in ids:
            fleet.engines[eid] = start_engine(model_dir, log_path=root / f"{eid}.log",
                                              extra_args=ENGINE_ARGS, env=ENV)
        fleet.write_fleet()
        fleet.write_profiles()
        yield fleet
    finally:
        for e in fleet.engines.values():
            e.stop()


@dataclass(frozen=True)
class CheckRun:
    code: int
    stdout: str
    stderr: str
    document: dict[str, Any] | None  # --json output

    def failures(self) -> list[str]:
        """Every failed verdict in one line each, for assertion messages."""
        assert self.document is not None, self.stderr
        return [f"{v['gate']} {v['subject']}: {v['detail']}" for v in self.document["verdicts"]
                if v["status"] == "fail"]

    def verdicts(self, gate: str, status: str | None = None) -> dict[str, dict[str, Any]]:
        assert self.document is not None, self.stderr
        return {v["subject"]: v for v in self.document["verdicts"]
                if v["gate"] == gate and (status is None or v["status"] == status)}


def run_check(fleet: Path, *args: str, json_out: bool = True, timeout: float = 120,
              env: dict[str, str] | None = None) -> CheckRun:
    argv = [sys.executable, "-m", "narwhal.serve.check_cli", "--fleet", str(fleet), *args]
    if json_out:
        argv.append("--json")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})
    doc = None
    if json_out and done.returncode in (0, 1):
        doc = json.loads(done.stdout)
    return CheckRun(done.returncode, done.stdout, done.stderr, doc)
