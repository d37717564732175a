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


@pytest.mark.parametrize("value", [
    "abc:2026-12-02T10:00:00Z",  # not a full Id
    "a" * 64,  # no creation time
    "a" * 64 + ":",  # an empty creation time
    "A" * 64 + ":2026-12-02T10:00:00Z",  # docker prints Ids in lower case
    "a" * 64 + ":2026-12-02 10:00:00",  # whitespace smuggled into the time
    "a" * 64 + ":" + "9" * 5000,  # without bound
    "a" * 64 + "\n--privileged:x",  # structure smuggled into the Id
])
def test_a_start_refuses_a_malformed_owned_container_before_it_reads_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    assert main(["start", "--run-dir", str(tmp_path), "--replace-owned", value]) != 0
    got = result_line.parse(capsys.readouterr().out, "narwhal-engine start")
    assert not got.ok and "--replace-owned" in got.error and "64 hex" in got.error
    assert len(got.error) < 400  # a value without bound is not echoed whole
    assert list(tmp_path.iterdir()) == []
