"""Every engine runtime (docker, podman, native) is driven through the same protocol, chosen
by name in one place: each starts, reports one identity, answers alive, gives its log's tail
and stops only what it started."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from narwhal.node.engine import runtime
from narwhal.node.engine.errors import RuntimeError_
from narwhal.node.engine.runtimes import NAMES, choose
from narwhal.node.engine.runtimes.base import Runtime, Started

CONTAINER_ID = "c" * 64
# A stand-in for the docker CLI (podman keeps it): one container, its state in a file.
FAKE = f"""#!/bin/sh
state="$FAKE_STATE"
echo "$(basename "$0") $*" >> "$state.calls"
case "$1" in
  run) echo running > "$state"; echo {CONTAINER_ID} ;;
  inspect) [ -f "$state" ] || exit 1
           case "$6" in {CONTAINER_ID}|narwhal-engine-1) ;; *) exit 1 ;; esac
           echo "{CONTAINER_ID}|2026-01-01T00:00:00Z|true" ;;
  logs) printf 'loading\\nready\\n' ;;
  rm) rm -f "$state" ;;
esac
"""


@pytest.fixture
def fake_runtimes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("docker", "podman"):
        (folder / name).write_text(FAKE)
        (folder / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_STATE", str(tmp_path / "container"))
    return tmp_path / "container"


def _plan(name: str, run_dir: Path) -> dict[str, Any]:
    if name == "native":
        return {"runtime": name, "argv": ["sh", "-c", "echo loading; echo ready; exec sleep 60"],
                "environment": {}, "run_dir": str(run_dir), "container_name": None}
    return {"runtime": name, "container_name": "narwhal-engine-1", "run_dir": str(run_dir),
            "argv": [name, "run", "-d", "--name", "narwhal-engine-1", "sha256:img"]}


def test_the_chooser_knows_exactly_the_three_runtimes_and_names_them_when_refusing() -> None:
    assert NAMES == ("docker", "podman", "native")
    assert [choose(n).name for n in NAMES] == list(NAMES)
    assert [choose(n).contained for n in NAMES] == [True, True, False]
    with pytest.raises(RuntimeError_, match="docker, podman, native"):
        choose("containerd")


@pytest.mark.parametrize("name", NAMES)
def test_each_runtime_starts_reports_its_identity_and_stops_only_what_it_started(
        name: str, fake_runtimes: Path, tmp_path: Path) -> None:
    chosen: Runtime = choose(name)
    log = tmp_path / "engine.log"
    started, ran = runtime.start(_plan(name, tmp_path), {}, log)
    try:
        assert started.runtime == name and runtime.alive(started)
        assert [r["argv"][:2] for r in ran] == ([] if name == "native" else [[name, "run"]])
        if name == "native":
            deadline = time.monotonic() + 10  # the shell writes its lines as it starts
            while b"ready" not in log.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.02)
        tail, total = runtime.log_tail(started, log, 1 << 20)
        assert tail.splitlines() == [b"loading", b"ready"] and total == len(tail)
        assert runtime.log_source(started, log) == (
            str(log) if name == "native" else f"{name} logs {CONTAINER_ID}")
        other = Started(name, started.id, "not-when-it-was-created")
        assert chosen.alive(other) is False  # a reused pid or Id is never taken for it
    finally:
        said = runtime.stop(started)
    assert said in ("stopped", "removed")
    assert not runtime.alive(started)
    assert runtime.stop(started) == "already gone"


def test_a_container_of_the_plans_name_that_the_record_does_not_own_refuses_the_start(
        fake_runtimes: Path, tmp_path: Path) -> None:
    fake_runtimes.write_text("running")
    with pytest.raises(RuntimeError_, match="does not own it"):
        runtime.start(_plan("podman", tmp_path), {}, tmp_path / "engine.log")
    started, ran = runtime.start(_plan("podman", tmp_path), {}, tmp_path / "engine.log",
                                 frozenset({(CONTAINER_ID, "2026-01-01T00:00:00Z")}))
    assert [r["argv"][:2] for r in ran] == [["podman", "rm"], ["podman", "run"]]
    assert started == Started("podman", CONTAINER_ID, "2026-01-01T00:00:00Z")


def test_without_a_start_the_log_is_the_file_a_native_engine_writes(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    assert runtime.log_tail(None, log, 10) == (b"", 0)
    log.write_bytes(b"one\ntwo\nthree\n")
    assert runtime.log_tail(None, log, 8) == (b"three\n", 14)
    assert runtime.log_source(None, log) == str(log)
