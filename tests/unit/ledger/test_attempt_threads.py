"""Hosts inspected concurrently all record into one attempt without losing or mixing a command."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from narwhal.deploy.hosts.base import RunResult
from narwhal.deploy.hosts.local import LocalHost
from tests.unit.ledger.records import ledger_for_valid_env

THREADS = 16
PER_THREAD = 50


_ledger = ledger_for_valid_env


def _all_at_once(work: Callable[[int], None]) -> list[BaseException]:
    """Run work(0..THREADS-1) on THREADS threads released together; return what they raised."""
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def body(t: int) -> None:
        start.wait()
        try:
            work(t)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _rows(path: Path) -> list[dict[str, object]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        row = json.loads(line)  # every line is one whole row
        assert isinstance(row, dict), f"{path}:{number}"
        rows.append(row)
    return rows


def test_sixteen_threads_recording_at_once_lose_and_mix_no_command(tmp_path: Path) -> None:
    """800 commands from 16 threads: seq 1..800 once each, every output file is its own."""
    ledger = _ledger(tmp_path)

    def record(t: int) -> None:
        for i in range(PER_THREAD):
            now = time.time()
            out, err = f"out {t}-{i}\n".encode(), f"err {t}-{i}\n".encode()
            attempt.record_command(
                RunResult(f"node-{t}", ("probe", f"{t}-{i}"), 0, out, err, now, now), "local")

    with ledger.attempt("discover", fingerprint={}, hosts={}) as attempt:
        errors = _all_at_once(record)
    assert errors == []
    rows = _rows(attempt.folder / "commands.jsonl")
    assert [row["seq"] for row in rows] == list(range(1, THREADS * PER_THREAD + 1))
    for row in rows:
        tag = row["argv"][1]  # type: ignore[index]
        for stream in ("stdout", "stderr"):
            meta = row[stream]
            assert isinstance(meta, dict)
            assert meta["path"] == f"out/{row['seq']:05d}.{stream}"
            want = f"{stream[3:]} {tag}\n".encode()
            assert (attempt.folder / meta["path"]).read_bytes() == want
    assert sorted(r["argv"][1] for r in rows) == sorted(  # type: ignore[index]
        f"{t}-{i}" for t in range(THREADS) for i in range(PER_THREAD))
    verdict = json.loads((attempt.folder / "attempt.json").read_text())
    assert verdict["verdict"] == "passed" and verdict["commands"] == THREADS * PER_THREAD


def test_files_created_by_concurrent_threads_are_each_owned_once(tmp_path: Path) -> None:
    """owned.jsonl holds one whole row per created file, however many threads create them."""
    ledger = _ledger(tmp_path)
    target = tmp_path / "made"
    target.mkdir()

    def create(t: int) -> None:
        host = LocalHost(f"node-{t}")
        for i in range(3):
            attempt.create_file(host, str(target / f"{t}-{i}.txt"), f"{t}-{i}\n".encode())

    with ledger.attempt("engines", fingerprint={}, hosts={}) as attempt:
        errors = _all_at_once(create)
    assert errors == []
    owned = _rows(attempt.folder / "owned.jsonl")
    assert sorted(row["path"] for row in owned) == sorted(  # type: ignore[type-var]
        str(target / f"{t}-{i}.txt") for t in range(THREADS) for i in range(3))
    commands = _rows(attempt.folder / "commands.jsonl")
    assert [row["seq"] for row in commands] == list(range(1, len(commands) + 1))


def test_threads_sharing_one_host_session_record_every_command(tmp_path: Path) -> None:
    """Roles on one physical host share its session: no thread unbinds it under another."""
    ledger = _ledger(tmp_path)
    target = tmp_path / "made"
    target.mkdir()
    host = LocalHost("node-1")

    def create(t: int) -> None:
        for i in range(3):
            attempt.create_file(host, str(target / f"{t}-{i}.txt"), b"x")

    with ledger.attempt("engines", fingerprint={}, hosts={}) as attempt:
        errors = _all_at_once(create)
        assert host.recorder is None
    assert errors == []
    # create_file runs one command (write, check, link and report the inode in one script).
    assert len(_rows(attempt.folder / "commands.jsonl")) == THREADS * 3


def test_appended_rows_larger_than_a_pipe_buffer_never_interleave(tmp_path: Path) -> None:
    """Rows well over PIPE_BUF (where the kernel stops promising atomic writes) stay whole."""
    ledger = _ledger(tmp_path).ensure()
    path = ledger.root / "rows.jsonl"
    blob = "x" * 70_000

    def append(t: int) -> None:
        for i in range(20):
            ledger.writer.append_row(path, {"t": t, "i": i, "blob": blob})

    assert _all_at_once(append) == []
    rows = _rows(path)
    assert len(rows) == THREADS * 20
    assert {(r["t"], r["i"]) for r in rows} == {(t, i) for t in range(THREADS) for i in range(20)}
