"""Every console script exists and says what it does; `narwhal --help` lists the gates."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SCRIPTS = ["narwhal", "narwhal-engine", "narwhal-attest", "narwhal-profile", "narwhal-check",
           "narwhal-serve"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_console_script_says_what_it_does(script: str) -> None:
    exe = BIN / script
    if not exe.exists():
        found = shutil.which(script)
        assert found, f"{script} is not installed"
        exe = Path(found)
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert len(done.stdout.strip()) > 40


def test_narwhal_help_lists_the_gates() -> None:
    done = subprocess.run([str(BIN / "narwhal"), "--help"], capture_output=True, text=True,
                          check=True)
    for gate in ("discover", "install", "engines", "fabric", "attest", "preflight", "serve"):
        assert gate in done.stdout


def test_deploy_refuses_an_unknown_gate_naming_the_known_ones(tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "narwhal"), "deploy", "--until", "H"], capture_output=True,
                          text=True, check=False, cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown gate 'H'" in done.stderr and "G=serve" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_deploy_without_inputs_says_which_file_and_records_nothing(tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "narwhal"), "deploy", "--env", str(tmp_path / "none.env"),
                           "--runs", str(tmp_path / "runs")], capture_output=True, text=True,
                          check=False)
    assert done.returncode != 0 and "none.env" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_unknown_subcommand_is_a_usage_error() -> None:
    done = subprocess.run([str(BIN / "narwhal"), "launch-everything"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2
