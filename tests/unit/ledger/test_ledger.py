"""The ledger records attempts once, blocks before changing state, and computes staleness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.core.errors import GateBlocked, LedgerError
from narwhal.deploy.cli.main import main
from narwhal.deploy.gates.registry import env_fingerprints
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.inputs import load_inputs
from narwhal.deploy.ledger import Ledger
from tests.envtext import valid_env


def _env(tmp_path: Path, **overrides: str | None) -> Path:
    env = tmp_path / ".env"
    env.write_text(valid_env(**overrides))
    env.chmod(0o600)
    return env


def _ledger(env: Path, tmp_path: Path) -> Ledger:
    inputs = load_inputs(env)
    return Ledger(tmp_path / "runs", inputs.deployment, inputs.secrets())


def test_attempt_records_commands_with_digests_and_verdict(tmp_path: Path) -> None:
    ledger = _ledger(_env(tmp_path), tmp_path)
    host = LocalHost()
    with ledger.attempt("discover", fingerprint={"x": "1"}, hosts={"workstation": []}) as att:
        with att.bind(host):
            host.run(["echo", "hello"], check=True)
            host.run(["sh", "-c", "exit 3"])
        att.add_artifact("facts.json", b"{}\n")
    folder = att.folder
    rows = [json.loads(line) for line in (folder / "commands.jsonl").read_text().splitlines()]
    assert [r["exit_status"] for r in rows] == [0, 3]
    assert rows[0]["argv"] == ["echo", "hello"] and rows[0]["host"] == "workstation"
    assert (folder / rows[0]["stdout"]["path"]).read_bytes() == b"hello\n"
    doc = json.loads((folder / "attempt.json").read_text())
    assert doc["verdict"] == "passed" and doc["schema"] == "narwhal.attempt"
    assert set(doc["artifacts"]) == {"facts.json"}
    assert doc["source_revision"]["package_version"]
    for path in folder.rglob("*"):
        assert path.stat().st_mode & 0o777 in (0o600, 0o700)


def test_evidence_is_never_overwritten(tmp_path: Path) -> None:
    ledger = _ledger(_env(tmp_path), tmp_path)
    with pytest.raises(LedgerError, match="never overwritten"), \
            ledger.attempt("discover", fingerprint={}, hosts={}) as att:
        att.add_artifact("a.json", b"1")
        att.add_artifact("a.json", b"2")
    assert (att.folder / "a.json").read_bytes() == b"1"


def test_blocked_gate_is_recorded_with_its_cause(tmp_path: Path) -> None:
    ledger = _ledger(_env(tmp_path), tmp_path)
    with pytest.raises(GateBlocked), ledger.attempt("fabric", fingerprint={}, hosts={}) as att:
        att.block("eng1 -> eng2 below budget")
    entry = ledger.load()["gates"]["fabric"]
    assert entry["state"] == "blocked" and "below budget" in entry["cause"]
    assert json.loads((att.folder / "attempt.json").read_text())["verdict"] == "blocked"


def test_retry_is_a_new_attempt_linked_to_the_last(tmp_path: Path) -> None:
    ledger = _ledger(_env(tmp_path), tmp_path)
    with pytest.raises(RuntimeError), ledger.attempt("install", fingerprint={}, hosts={}):
        raise RuntimeError("pip interrupted")
    with ledger.attempt("install", fingerprint={}, hosts={}) as second:
        pass
    first_id = ledger.load()["gates"]["install"]["attempts"][0]
    assert second.start_doc["retry_of"] == first_id
    assert second.id != first_id


def test_moved_input_makes_gate_and_later_gates_stale(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    env = _env(tmp_path)
    ledger = _ledger(env, tmp_path)
    prints = env_fingerprints(load_inputs(env))
    for gate in ("discover", "install", "engines", "fabric"):
        with ledger.attempt(gate, fingerprint=prints[gate], hosts={}):
            pass
    _env(tmp_path, NARWHAL_ENGINE_IMAGE="sha256:" + "cd" * 32)
    assert main(["status", "--json", "--env", str(env), "--runs", str(tmp_path / "runs")]) == 0
    rows = {r["gate"]: r for r in json.loads(capsys.readouterr().out)["gates"]}
    assert rows["discover"]["state"] == "stale"
    assert "engine-image" in rows["discover"]["reason"]
    assert rows["discover"]["repeat"] == ["discover", "install", "engines", "fabric"]
    assert rows["install"]["state"] == "stale" and "upstream" in rows["install"]["reason"]
    assert rows["attest"]["state"] == "pending"


def test_status_table_names_every_gate(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    env = _env(tmp_path)
    assert main(["status", "--env", str(env), "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    for name in ("discover", "install", "engines", "fabric", "attest", "preflight", "serve"):
        assert name in out
