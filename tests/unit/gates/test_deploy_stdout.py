"""`narwhal deploy --json` prints one document on stdout: while a gate runs, what any child
process writes to file descriptor 1 goes to stderr instead."""

from __future__ import annotations

import subprocess
import sys

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
