"""Gate B's install lock on a host: held while its owner lives, stale only once it is gone.

A crashed installer must not block every later install forever, and a live one (or one on
another workstation, whose liveness this workstation cannot see) must never be pushed
aside. The lock runs through the real host commands on the workstation's own LocalHost.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal.core.errors import HostError
from narwhal.deploy.gates.install import _owner_gone, _take_lock
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.local import LocalHost


def _boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _ticks(pid: int) -> int:
    return cl.parse_start_ticks(Path(f"/proc/{pid}/stat").read_text())


def _owner(pid: int, start: int, workstation: str | None = None, boot: str | None = None) -> str:
    return json.dumps({"workstation": workstation or socket.gethostname(),
                       "boot": boot or _boot(), "pid": pid, "start": start, "attempt": "a"},
                      sort_keys=True)


def test_a_lock_held_by_a_live_installer_is_refused_naming_it(tmp_path: Path) -> None:
    lock = str(tmp_path / ".install-lock")
    host = LocalHost()
    live = _owner(1, _ticks(1))  # pid 1 is alive for as long as this test runs
    _take_lock(host, lock, live)
    with pytest.raises(HostError, match="another install holds"):
        _take_lock(host, lock, _owner(2, 0))
    assert Path(lock).read_text().strip() == live


def test_a_lock_whose_owner_is_gone_is_taken_over(tmp_path: Path) -> None:
    lock = str(tmp_path / ".install-lock")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = _ticks(gone.pid)
    gone.wait()
    Path(lock).write_text(_owner(gone.pid, ticks) + "\n")
    mine = _owner(1, _ticks(1))
    _take_lock(LocalHost(), lock, mine)
    assert Path(lock).read_text().strip() == mine


def test_a_reused_pid_or_an_earlier_boot_counts_as_gone() -> None:
    assert _owner_gone(_owner(1, _ticks(1) + 1))  # pid 1, but not the process that locked
    assert _owner_gone(_owner(1, _ticks(1), boot="another-boot"))
    assert not _owner_gone(_owner(1, _ticks(1)))


@pytest.mark.parametrize("text", [
    _owner(999999, 1, workstation="another-workstation"),  # its liveness is not ours to judge
    "not json", '{"workstation": 1}', ""])
def test_an_owner_this_workstation_cannot_judge_is_never_presumed_dead(text: str) -> None:
    assert not _owner_gone(text)


def test_dropping_a_lock_never_removes_someone_elses(tmp_path: Path) -> None:
    lock = tmp_path / ".install-lock"
    lock.write_text("theirs\n")
    LocalHost().run(cl.lock_drop(str(lock), "mine"), check=True)
    assert lock.read_text() == "theirs\n"
