"""`narwhal lab ...` reaches the lab through the distribution root, never through product code."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal import commands
from narwhal.commands import CommandGroup

BIN = Path(sys.executable).parent
# The module, not the `main` function that narwhal.deploy.cli re-exports under the same name.
cli = importlib.import_module("narwhal.deploy.cli.main")


def test_narwhal_lab_reaches_the_labs_own_parser() -> None:
    done = subprocess.run([str(BIN / "narwhal"), "lab", "up", "--help"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "usage: narwhal lab up" in done.stdout and "--env-out" in done.stdout


def test_narwhal_help_still_lists_lab_without_loading_it() -> None:
    probe = ("import sys; from narwhal.deploy.cli.main import build_parser; "
             "build_parser().format_help(); print(sorted(m for m in sys.modules "
             "if m.startswith('narwhal.lab')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
    assert "lab" in cli.build_parser().format_help()


def test_a_group_whose_package_is_missing_says_not_built(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    missing = CommandGroup("lab", "rehearsal", "narwhal_not_installed.cli", "rehearsal fleet")
    monkeypatch.setattr(cli, "GROUPS", (missing,))
    assert cli.main(["lab", "up"]) == 3
    assert "not built yet" in capsys.readouterr().err


def test_a_missing_dependency_inside_a_group_is_not_hidden_as_not_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "group_with_broken_dep.py").write_text(
        "import dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = CommandGroup("x", "x", "group_with_broken_dep", "x")
    with pytest.raises(ModuleNotFoundError, match="dependency_that_is_not_installed"):
        commands.load(broken)
