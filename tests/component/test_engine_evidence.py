"""Gate C's record of an engine, on loopback: an emulator started by `narwhal-engine` (native
runtime) with an API key, captured through the gate's own capture step (engines._capture,
every call through a host bound to a real attempt), and what the attempt keeps beside the
capture: the engine's log (engine-log-<role>.txt) and the capture's HTTP exchanges
(http-<role>.json), each listed in attempt.json with its sha256, private, and holding what it
says; the engine's key nowhere in the record. A capture that fails keeps them too."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.core.errors import HostError
from narwhal.core.launch_record import ENGINE_API_KEY_ENV, LaunchRecord
from narwhal.deploy.gates import engines
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.ledger import Ledger
from narwhal.lab.engine.testing import free_port, write_tiny_llama
from narwhal.node.engine.capture import COMPLETION_PROMPT
from tests.native_engine import engine, launch_record

pytestmark = pytest.mark.timeout(240)
ENTRYPOINT = [sys.executable, "-m", "narwhal.lab.engine", "serve"]
ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", "64M"]
KEY = "sk-engine-evidence-5521"
ROLE = "e1"


class LocalRemote(engines.Remote):
    """Gate C's view of one engine whose host is this machine: its own `call` (the installed
    tool is a wrapper running this checkout's narwhal-engine), paths of the test's run dir."""

    def __init__(self, tool: Path, target: engines.EngineTarget, run_dir: Path,
                 secrets: Path) -> None:
        self.host, self.t, self.owned = LocalHost("node-1"), target, []
        self.tool, self.run_dir, self.secrets = str(tool), str(run_dir), str(secrets)
        self.launch = ""


@dataclass
class Started:
    remote: LocalRemote
    http_port: int


def _tool(root: Path) -> Path:
    tool = root / "narwhal-engine"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} -m narwhal.node.engine_cli "$@"\n')
    tool.chmod(0o700)
    return tool


def _record(root: Path, http: int) -> LaunchRecord:
    path = root / f"{ROLE}.json"
    doc = launch_record(path, ROLE, entrypoint=ENTRYPOINT, model=write_tiny_llama(root / "tiny"),
                        served="tiny", http=http, side=free_port(), attest=free_port(),
                        vllm_args=ARGS, environment={})
    path.write_text(json.dumps({**doc, "secret_environment": [ENGINE_API_KEY_ENV]}))
    return LaunchRecord.model_validate_json(path.read_bytes())


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    root = tmp_path_factory.mktemp("evidence")
    http = free_port()
    record = _record(root, http)
    secrets = root / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / ENGINE_API_KEY_ENV).write_text(KEY + "\n")
    (secrets / ENGINE_API_KEY_ENV).chmod(0o600)
    run_dir = root / ROLE
    try:
        for sub, args in (("prepare", ("--launch", str(root / f"{ROLE}.json"))), ("check", ()),
                          ("start", ("--secrets", str(secrets)))):
            done = engine(sub, *args, "--run-dir", str(run_dir))
            assert done.ok, (sub, done.error, done.data)
        target = engines.EngineTarget(ROLE, "node-1", record, "0" * 64)
        yield Started(LocalRemote(_tool(root), target, run_dir, secrets), http)
    finally:
        engine("stop", "--run-dir", str(run_dir))


def _capture(tmp_path: Path, r: LocalRemote) -> tuple[Path, Any]:
    """engines._capture in a real attempt; its folder and what it returned or raised."""
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    got: Any = None
    with ledger.attempt("engines", fingerprint={}, hosts={"node-1": [ROLE]}) as attempt, \
            attempt.bind(r.host):
        try:
            got = engines._capture(r, attempt, lambda *_: None)
        except HostError as exc:
            got = exc
    return attempt.folder, got


def _listed(folder: Path, name: str) -> bytes:
    """An artifact's bytes, after checking attempt.json lists it with its sha256, 0600."""
    data = (folder / name).read_bytes()
    listed = json.loads((folder / "attempt.json").read_text())["artifacts"]
    assert listed[name] == hashlib.sha256(data).hexdigest(), name
    assert (folder / name).stat().st_mode & 0o777 == 0o600, name
    return data


def _key_nowhere(folder: Path) -> None:
    for path in folder.rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path


def test_the_attempt_keeps_the_engines_log_with_its_startup_lines(
        started: Started, tmp_path: Path) -> None:
    folder, layout = _capture(tmp_path, started.remote)
    assert not isinstance(layout, HostError), layout
    log = _listed(folder, f"engine-log-{ROLE}.txt").decode()
    first, _, rest = log.partition("\n")
    assert first == (f"# narwhal: {ROLE}'s engine log from {started.remote.run_dir}/engine.log: "
                     f"the whole log, {len(rest.encode())} bytes")
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{started.http_port}" in rest
    assert "KV cache size:" in rest  # the lines the capture's layout was read from
    _listed(folder, f"cache-layout-{ROLE}.json")
    _key_nowhere(folder)


def test_the_attempt_keeps_every_http_exchange_of_the_capture_as_received(
        started: Started, tmp_path: Path) -> None:
    folder, layout = _capture(tmp_path, started.remote)
    doc = json.loads(_listed(folder, f"http-{ROLE}.json"))
    byname = {x["what"]: x for x in doc["exchanges"]}
    assert list(byname) == ["version", "models", "metrics", "completion"]
    assert all(x["response"]["status"] == 200 for x in byname.values())
    done = byname["completion"]
    assert json.loads(done["request"]["body"]["text"])["prompt"] == COMPLETION_PROMPT
    answer = json.loads(done["response"]["body"]["text"])
    assert answer["choices"][0]["text"] == layout.completion.text  # what the capture parsed
    assert done["request"]["not_kept"] == byname["models"]["request"]["not_kept"] == [
        "Authorization"]  # sent (the key-guarded /v1 routes answered 200), never stored
    assert "vllm:cache_config_info" in byname["metrics"]["response"]["body"]["text"]
    assert json.loads(byname["models"]["response"]["body"]["text"])["data"][0]["id"] == "tiny"
    _key_nowhere(folder)


def test_a_failed_capture_still_leaves_the_log_and_the_refusal_that_failed_it(
        started: Started, tmp_path: Path) -> None:
    """The plan asks for a model the engine does not serve: the completion is refused."""
    plan_path = Path(started.remote.run_dir) / "launch.json"
    plan = plan_path.read_bytes()
    plan_path.write_text(json.dumps({**json.loads(plan), "served_model_name": "not-served"}))
    try:
        folder, got = _capture(tmp_path, started.remote)
    finally:
        plan_path.write_bytes(plan)
    assert isinstance(got, HostError) and "capture failed" in str(got)
    assert "answered 404" in str(got)  # the capture's own error, not the evidence step's
    completion = json.loads(_listed(folder, f"http-{ROLE}.json"))["exchanges"][-1]
    assert completion["what"] == "completion" and completion["response"]["status"] == 404
    assert "not-served" in completion["response"]["body"]["text"]
    assert b"Starting vLLM API server" in _listed(folder, f"engine-log-{ROLE}.txt")
    assert not (folder / f"cache-layout-{ROLE}.json").exists()
    _key_nowhere(folder)
