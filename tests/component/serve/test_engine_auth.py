"""Credentials end to end on loopback: the router's tenant key and the engines' API key.

Two vLLM-faithful emulators started as `narwhal-engine start` starts them (vLLM's API key in
VLLM_API_KEY, never argv) and a router whose fleet names both keys by their 0600 files, as
`narwhal deploy` writes it: a client without the tenant key is refused with an OpenAI-shaped
401, an engine answers nobody without the engine key, and the router's legs carry it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from narwhal.lab.engine.testing import RunningEngine, free_port, start_engine, write_tiny_llama
from tests.component.serve.harness import Router, call, journal_rows

pytestmark = pytest.mark.timeout(180)
KV_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
ENGINE_ARGS = ["--served-model-name", "tiny", "--kv-transfer-config", KV_BOTH,
               "--emu-platform", "cpu", "--dtype", "float32", "--enforce-eager",
               "--kv-cache-memory-bytes", "64M", "--emu-zero-delay"]
BODY = {"model": "tiny", "prompt": "the sea", "max_tokens": 4}


@dataclass
class Keyed:
    prefill: RunningEngine
    decode: RunningEngine
    router: Router
    root: Path
    tenant_key: str
    engine_key: str


def _key_file(path: Path, key: str, mode: int = 0o600) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.chmod(path, mode)
    return path.name


def _fleet(root: Path, engines: list[RunningEngine], name: str = "fleet.json",
           **sections: object) -> Path:
    doc = {"schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
           "engines": [{"id": "p0", "url": engines[0].url, "role": "prefill"},
                       {"id": "d0", "url": engines[1].url, "role": "decode"}],
           "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": str(root / "journal.jsonl")},
           **sections}
    path = root / name
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    root = tmp_path_factory.mktemp("auth")
    model = write_tiny_llama(root / "tiny")
    tenant_key, engine_key = secrets.token_hex(24), secrets.token_hex(24)
    engines: list[RunningEngine] = []
    router: Router | None = None
    try:
        for name in ("p0", "d0"):
            engines.append(start_engine(model, log_path=root / f"{name}.log",
                                        extra_args=ENGINE_ARGS,
                                        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                             "VLLM_API_KEY": engine_key}))
        fleet = _fleet(root, engines, tenants=[{"name": "team", "key_file": _key_file(
            root / "tenant.key", tenant_key)}], engine_auth={"key_file": _key_file(
                root / "engine.key", engine_key)}, operations={"open": True})
        router = Router(fleet, free_port()).start()  # ready: its probes carried the key
        yield Keyed(engines[0], engines[1], router, root, tenant_key, engine_key)
    finally:
        if router is not None and router.proc is not None and router.proc.poll() is None:
            router.stop()
        for engine in engines:
            engine.stop()


def test_a_client_without_the_tenant_key_gets_an_openai_shaped_401(keyed: Keyed) -> None:
    for headers in ({}, {"authorization": "Bearer " + secrets.token_hex(24)},
                    {"authorization": f"Bearer {keyed.engine_key}"},
                    {"authorization": f"Basic {keyed.tenant_key}"}):
        got = call(keyed.router.port, "POST", "/v1/completions", BODY, headers)
        assert got.status == 401, (headers.keys(), got.body[:200])
        error = got.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"]
        assert got.headers.get("www-authenticate") == "Bearer"


def test_the_tenant_key_is_served_through_both_legs_with_the_engine_key(keyed: Keyed) -> None:
    got = call(keyed.router.port, "POST", "/v1/completions", BODY,
               {"authorization": f"Bearer {keyed.tenant_key}", "x-request-id": "auth-ok"})
    assert got.status == 200, got.body[:300]
    assert got.json()["choices"][0]["text"]
    deadline = time.monotonic() + 5
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline and not rows:
        rows = [r for r in journal_rows(keyed.root / "journal.jsonl")
                if r.get("request_id") == "auth-ok"]
        time.sleep(0.05)
    assert rows and rows[0]["prefill_engine"] == "p0" and rows[0]["decode_engine"] == "d0"
    assert rows[0]["tenant"] == "team"


def test_an_engine_answers_its_v1_routes_only_with_the_engine_key(keyed: Keyed) -> None:
    for engine in (keyed.prefill, keyed.decode):
        assert call(engine.port, "POST", "/v1/completions", BODY).status == 401
        assert call(engine.port, "GET", "/v1/models").status == 401
        wrong = {"authorization": f"Bearer {keyed.tenant_key}"}
        assert call(engine.port, "POST", "/v1/completions", BODY, wrong).status == 401
        right = {"authorization": f"Bearer {keyed.engine_key}"}
        assert call(engine.port, "POST", "/v1/completions", BODY, right).status == 200
        # as in vLLM, only /v1 is guarded: health and metrics stay readable to monitoring
        assert call(engine.port, "GET", "/health").status == 200


def test_no_key_is_in_any_argv_or_log(keyed: Keyed) -> None:
    assert keyed.router.proc is not None
    pids = [keyed.router.proc.pid, keyed.prefill.pid, keyed.decode.pid]
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert keyed.tenant_key.encode() not in argv and keyed.engine_key.encode() not in argv
    for log in keyed.root.glob("*.log"):
        data = log.read_bytes()
        assert keyed.tenant_key.encode() not in data and keyed.engine_key.encode() not in data
    journal = (keyed.root / "journal.jsonl").read_bytes()
    assert keyed.tenant_key.encode() not in journal and keyed.engine_key.encode() not in journal


def test_a_router_without_the_engine_key_holds_every_engine_out_and_says_why(
        keyed: Keyed) -> None:
    """An engine that refuses the router's key would refuse every leg: the router is not ready,
    a request gets 503 rather than the engine's 401 passed off as the client's, and
    /narwhal/state names the key as the reason."""
    fleet = _fleet(keyed.root, [keyed.prefill, keyed.decode], "fleet-nokey.json")
    router = Router(fleet, free_port()).start(wait_ready=False)
    try:
        deadline = time.monotonic() + 20
        engines: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            engines = call(router.port, "GET", "/narwhal/state").json()["engines"]
            if all("engine key" in str(e.get("ejected_reason")) for e in engines):
                break
            time.sleep(0.1)
        assert all("engine_auth.key_file" in str(e.get("ejected_reason")) for e in engines), \
            engines
        assert call(router.port, "GET", "/ready").status == 503
        got = call(router.port, "POST", "/v1/completions", BODY)
        assert got.status == 503, got.body[:300]
    finally:
        router.stop()


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_key_file_others_can_read_stops_the_router_naming_it(keyed: Keyed, mode: int) -> None:
    key_name = _key_file(keyed.root / f"open-{mode:o}.key", secrets.token_hex(24), mode)
    fleet = _fleet(keyed.root, [keyed.prefill, keyed.decode], f"fleet-{mode:o}.json",
                   engine_auth={"key_file": key_name})
    router = Router(fleet, free_port())
    with pytest.raises(RuntimeError) as caught:
        router.start()
    assert "engine_auth.key_file" in str(caught.value) and "chmod 600" in str(caught.value)


def _tool(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=170, check=False)


def test_the_preflight_tools_send_the_engine_key_on_every_call(keyed: Keyed) -> None:
    """narwhal-profile's sweeps (streamed and not) and narwhal-check's gates reach keyed
    engines with engine_auth; without it the profile fails naming the 401."""
    key = keyed.root / "engine.key"
    both = [{"id": "p0", "url": keyed.prefill.url, "role": "both"},
            {"id": "d0", "url": keyed.decode.url, "role": "both"}]
    for name, auth in (("keyed", {"engine_auth": {"key_file": str(key)}}), ("open", {})):
        fleet = keyed.root / f"profile-{name}.json"
        fleet.write_text(json.dumps({
            "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny", "engines": both,
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "journal.jsonl"},
            "profiles": {"path": f"profiles-{name}.json"}, **auth}))
        # six prefill lengths: with four, each leave-one-out fit has three points for three
        # coefficients, and one slow sample on a busy machine failed the fit (make test runs
        # the lab tier beside this one); the test is about the key, not the fit
        done = _tool("narwhal.serve.profile_cli", "--fleet", str(fleet), "--json",
                     "--repeats", "1", "--prefill-lengths", "64,128,192,256,384,512",
                     "--decode-concurrency", "1,2,4", "--decode-contexts", "64,256")
        if auth:
            assert done.returncode == 0, done.stderr[-2000:]
            checked = _tool("narwhal.serve.check_cli", "--fleet", str(fleet), "--json",
                            "--only", "reach,model")
            assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
        else:
            assert done.returncode != 0 and "401" in done.stdout + done.stderr
