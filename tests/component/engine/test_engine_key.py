"""`narwhal-engine` passes vLLM's API key to the engine from its 0600 file, through the
environment: the engine then refuses /v1 without it, and the capture (which sends it) passes.
The folder given to `prepare --secrets` is recorded in the plan, so an operator's own
`narwhal-engine start` from the role shell needs no flag for it."""

from __future__ import annotations

import json
import secrets
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from narwhal.lab.engine.testing import free_port, write_tiny_llama
from tests.native_engine import engine, launch_record

pytestmark = pytest.mark.timeout(180)
ENTRYPOINT = [sys.executable, "-m", "narwhal.lab.engine", "serve"]
ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "64M"]


def _status(url: str, key: str | None = None) -> int:
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(url, headers=auth)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:  # noqa: S310 - loopback
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_engine_key_reaches_the_engine_from_its_file_and_the_capture_sends_it(
        tmp_path: Path) -> None:
    key = secrets.token_hex(24)
    folder = tmp_path / "secrets" / "env"
    folder.mkdir(parents=True)
    (folder / "VLLM_API_KEY").write_text(key + "\n")
    (folder / "VLLM_API_KEY").chmod(0o600)
    http = free_port()
    record = tmp_path / "engine.json"
    doc = launch_record(record, "e", entrypoint=ENTRYPOINT, model=write_tiny_llama(
        tmp_path / "tiny"), served="tiny", http=http, side=free_port(), attest=free_port(),
        vllm_args=ARGS, environment={})
    record.write_text(json.dumps({**doc, "secret_environment": ["VLLM_API_KEY"]}))
    run_dir = tmp_path / "run"
    try:
        for sub, args in (("prepare", ("--launch", str(record), "--run-dir", str(run_dir),
                                       "--secrets", str(folder))),
                          ("check", ("--run-dir", str(run_dir))),
                          ("start", ("--run-dir", str(run_dir)))):  # no --secrets: the plan's
            done = engine(sub, *args)
            assert done.ok, (sub, done.error)
        cap = engine("capture", "--run-dir", str(run_dir), "--timeout", "120", timeout=220)
        assert cap.ok, cap.error
        assert cap.data["cache_layout"]["models"] == ["tiny"]  # /v1/models read with the key
        url = f"http://127.0.0.1:{http}/v1/models"
        assert _status(url) == 401 and _status(url, "wrong" * 5) == 401
        assert _status(url, key) == 200
        plan = (run_dir / "launch.json").read_text()
        assert key not in plan and str(folder.resolve()) in plan
        assert key.encode() not in Path(f"/proc/{cap.data['cache_layout']['started']['id']}"
                                        "/cmdline").read_bytes()
    finally:
        engine("stop", "--run-dir", str(run_dir))
