"""`narwhal trial` measures only a service Gate G vouches for: a serve gate that is not passed
and fresh is refused in one line, before anything is sent, and no trial is recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.deploy.actions.context import Context
from narwhal.deploy.cli.main import main
from narwhal.deploy.gates.trial import serve_refusal
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.ledger.status import GateStatus
from tests.unit.ledger.records import ledger_for_valid_env


def _row(state: str, reason: str = "") -> GateStatus:
    return GateStatus("serve", "G", state, 1, "001", reason, ())


def test_only_a_passed_and_fresh_gate_g_lets_the_trial_run() -> None:
    assert serve_refusal(_row("passed")) == ""
    for state in ("pending", "running", "failed", "blocked", "stale"):
        said = serve_refusal(_row(state, "input moved: router"))
        assert said.startswith(f"gate G (serve) is {state} (input moved: router)"), said
        assert "`narwhal serve`" in said and "`narwhal deploy`" in said
        assert "\n" not in said


def _no_hosts(self: Context) -> None:
    raise AssertionError("the trial reached for its hosts: it was about to send")


@pytest.mark.parametrize("serve_state", ["failed", "stale"])
def test_a_trial_on_a_gate_g_not_passed_and_fresh_is_refused_and_records_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        serve_state: str) -> None:
    ledger: Ledger = ledger_for_valid_env(tmp_path)
    if serve_state == "failed":
        with pytest.raises(RuntimeError), ledger.attempt("serve", fingerprint={}, hosts={}):
            raise RuntimeError("Prometheus exited")
    else:  # passed, on a router address the .env no longer names
        with ledger.attempt("serve", fingerprint={"router": "0" * 64}, hosts={}):
            pass
    monkeypatch.setattr(Context, "sessions", _no_hosts)

    code = main(["trial", "--rates", "1", "--env", str(tmp_path / ".env"),
                 "--runs", str(tmp_path / "runs")])

    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0, err
    assert err.startswith(f"narwhal trial: gate G (serve) is {serve_state}"), err
    assert "narwhal serve" in err and "narwhal deploy" in err
    assert "load-trial" not in ledger.load()["activities"]


def test_an_error_inside_the_trial_is_labelled_as_the_trials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from narwhal.core.errors import HostUnreachable
    from narwhal.deploy.gates.registry import SPECS, env_fingerprints
    from narwhal.deploy.gates.runner import fingerprint
    from narwhal.deploy.inputs import load_inputs

    ledger = ledger_for_valid_env(tmp_path)
    now = fingerprint(SPECS["serve"], ledger, env_fingerprints(load_inputs(tmp_path / ".env")))
    with ledger.attempt("serve", fingerprint=now, hosts={}):
        pass  # passed, and fresh

    def unreachable(self: Context) -> None:
        raise HostUnreachable("router", "did not answer within 10 s")
    monkeypatch.setattr(Context, "sessions", unreachable)

    code = main(["trial", "--rates", "1", "--env", str(tmp_path / ".env"),
                 "--runs", str(tmp_path / "runs")])

    assert code == 1
    assert capsys.readouterr().err.strip() == \
        "narwhal trial: router: did not answer within 10 s"
