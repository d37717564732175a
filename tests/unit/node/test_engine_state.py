"""`narwhal-engine state` on a run dir that never saw a start (a host whose run dir was lost):
not running, said in its one result line, and nothing written there."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core import result_line
from narwhal.node.engine_cli import main


def test_a_run_dir_without_a_start_is_not_running(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["state", "--run-dir", str(tmp_path)]) == 0
    got = result_line.parse(capsys.readouterr().out, "narwhal-engine state")
    assert got.ok and got.data == {"started": False, "running": False}
    assert list(tmp_path.iterdir()) == []
