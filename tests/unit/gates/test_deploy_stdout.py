"""`narwhal deploy --json` prints one document on stdout: while a gate runs, what any child
process writes to file descriptor 1 goes to stderr instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from narwhal.deploy.cli.deploy_cmd import _stdout_fd_to_stderr


def test_a_child_writing_to_stdout_during_a_gate_lands_on_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    with _stdout_fd_to_stderr():
        subprocess.run([sys.executable, "-c", "print('stray line from a child')"], check=True)
    print('{"verdict": "passed"}')
    out, err = capfd.readouterr()
    assert out == '{"verdict": "passed"}\n'
    assert "stray line from a child" in err


def test_a_gate_refused_before_any_attempt_gives_deploy_its_own_words(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A command that stops on its inputs records no attempt; deploy's cause is then the
    command's own `narwhal: ...` line, still shown on stderr as it was."""
    from narwhal.deploy.cli.deploy_cmd import _run_command

    env = tmp_path / ".env"
    env.write_text("NARWHAL_NOT_A_VARIABLE=1\n")
    env.chmod(0o600)
    code, output = _run_command(["discover", "--env", str(env), "--runs", str(tmp_path),
                                 "--json"], True)
    assert code != 0 and isinstance(output, str) and output.startswith("narwhal")
    assert "NARWHAL_NOT_A_VARIABLE" in output
    assert "NARWHAL_NOT_A_VARIABLE" in capfd.readouterr().err  # the operator still sees it
