"""`narwhal recover` removes exactly what a failed attempt created and keeps its evidence."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from narwhal.deploy.cli.main import main
from narwhal.deploy.hosts.sessions import Sessions
from narwhal.deploy.inputs import load_inputs
from narwhal.deploy.ledger import Ledger
from tests.component.conftest import write_env
from tests.component.sshd import KEY_USER, Sshd


def _digest_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_recover_removes_only_what_the_failed_attempt_created(sshd: Sshd, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    env = write_env(tmp_path / ".env", sshd)
    runs = tmp_path / "runs"
    common = ["--env", str(env), "--runs", str(runs), "--ssh-config", "/dev/null"]
    assert main(["hosts", "trust", "--yes", *common]) == 0
    inputs = load_inputs(env)
    ledger = Ledger(runs, inputs.deployment, inputs.secrets())
    sessions = Sessions(inputs, runs, ssh_config="/dev/null")
    home = f"{sshd.root}/home/{KEY_USER}"
    host = sessions.get("node-1")
    host.run(["sh", "-c", 'echo mine > "$1"', "sh", f"{home}/preexisting.txt"], check=True)
    try:
        with pytest.raises(RuntimeError), ledger.attempt(
                "engines", fingerprint={}, hosts=sessions.roles()) as attempt:
            attempt.make_dir(host, f"{home}/work")
            attempt.create_file(host, f"{home}/work/plan.json", b'{"plan": 1}\n')
            attempt.create_file(host, f"{home}/replaced.txt", b"original\n")
            proc = attempt.start_process(host, ["sleep", "300"], f"{home}/sleep.log")
            attempt.create_file(host, f"{home}/sleep.log.keep", b"x")
            raise RuntimeError("engine failed to start")
        # Someone replaces one created file after the attempt: recovery must keep it.
        host.run(["sh", "-c", 'rm -f "$1" && echo operator > "$1"', "sh",
                  f"{home}/replaced.txt"], check=True)
        failed = ledger.load()["gates"]["engines"]["attempts"][-1]
        evidence = ledger.attempt_folder("engines", failed)
        before = _digest_tree(evidence)
        assert host.process_start(proc.pid) == proc.start_ticks

        assert main(["recover", "engines", *common]) == 0
        out = capsys.readouterr().out

        assert host.stat_dir(f"{home}/work") is None
        assert host.stat_file(f"{home}/sleep.log.keep") is None
        assert host.run(["cat", f"{home}/replaced.txt"]).text == "operator\n"
        assert host.run(["cat", f"{home}/preexisting.txt"]).text == "mine\n"
        deadline = time.monotonic() + 5
        while host.process_start(proc.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.process_start(proc.pid) is None
        assert "replaced or changed after the attempt created it" in out
        assert _digest_tree(evidence) == before
        verdict = (evidence / "attempt.json").read_text()
        assert '"verdict": "failed"' in verdict and "engine failed to start" in verdict
        assert ledger.load()["gates"]["engines"]["state"] == "pending"
    finally:
        sessions.close()


def test_recover_refuses_a_passed_attempt(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from tests.envtext import valid_env

    env = tmp_path / ".env"
    env.write_text(valid_env())
    env.chmod(0o600)
    inputs = load_inputs(env)
    ledger = Ledger(tmp_path / "runs", inputs.deployment, inputs.secrets())
    with ledger.attempt("discover", fingerprint={}, hosts={}):
        pass
    code = main(["recover", "discover", "--env", str(env), "--runs", str(tmp_path / "runs")])
    assert code == 1
    assert "passed" in capsys.readouterr().err
