"""Gate C's engine evidence as the workstation keeps it: the log artifact says which part of
which log it holds, and a file whose bytes are not the ones the host named is never kept."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from narwhal.core.errors import HostError, TransferMismatch
from narwhal.deploy.gates.engine_evidence import fetch_all, log_header
from narwhal.deploy.hosts.local import LocalHost


def test_the_log_artifact_says_whether_it_is_the_whole_log_or_its_last_mebibytes() -> None:
    whole = log_header("engine-1", {"bytes": 120, "total_bytes": 120, "limit_bytes": 4 << 20,
                                    "source": "/srv/run/engine-1/engine.log"})
    assert whole == (b"# narwhal: engine-1's engine log from /srv/run/engine-1/engine.log: "
                     b"the whole log, 120 bytes\n")
    cut = log_header("engine-2", {"bytes": 4194000, "total_bytes": 9000000,
                                  "limit_bytes": 4 << 20, "source": "docker logs " + "a" * 64})
    assert b"its last 4194000 of 9000000 bytes (the last 4 MiB" in cut
    assert cut.startswith(b"# narwhal: engine-2's engine log from docker logs aaaa")


def _facts(path: Path, data: bytes) -> dict[str, object]:
    return {"path": str(path), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_named_file_is_read_whole_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "engine-log-tail.txt"
    path.write_bytes(b"INFO up\n")
    assert fetch_all(LocalHost(), [(_facts(path, b"INFO up\n"), 1024)]) == [b"INFO up\n"]


def test_a_file_changed_since_it_was_named_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "engine-log-tail.txt"
    path.write_bytes(b"INFO up, then rewritten\n")
    with pytest.raises(TransferMismatch, match="nothing was kept"):
        fetch_all(LocalHost(), [(_facts(path, b"INFO up\n"), 1024)])


def test_a_file_over_the_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "http-captures.json"
    path.write_bytes(b"x" * 100)
    with pytest.raises(HostError, match="more than the 10"):
        fetch_all(LocalHost(), [(_facts(path, b"x" * 100), 10)])


def test_the_log_and_the_exchanges_come_back_in_one_command_each_checked(tmp_path: Path) -> None:
    log, http = tmp_path / "engine.log", tmp_path / "http-captures.json"
    log.write_bytes(b"INFO up\n" * 50)
    http.write_bytes(b'{"exchanges": []}\n')
    host, seen = LocalHost(), []
    host.recorder = type("R", (), {"record_command": lambda _s, r, _t: seen.append(r)})()
    got = fetch_all(host, [(_facts(log, log.read_bytes()), 1024),
                           (_facts(http, http.read_bytes()), 1024)])
    assert got == [log.read_bytes(), http.read_bytes()] and len(seen) == 1


def test_a_first_file_rewritten_after_it_was_named_refuses_the_read(tmp_path: Path) -> None:
    """The bytes the host named are read, no more: a log appended to since is read as it was
    named, a rewritten one is refused."""
    log, http = tmp_path / "engine.log", tmp_path / "http-captures.json"
    log.write_bytes(b"INFO up\n")
    http.write_bytes(b"{}\n")
    named = [(_facts(log, b"INFO up\n"), 1024), (_facts(http, b"{}\n"), 1024)]
    with log.open("ab") as grown:
        grown.write(b"INFO more\n")
    assert fetch_all(LocalHost(), named) == [b"INFO up\n", b"{}\n"]
    log.write_bytes(b"WARN up\n")
    with pytest.raises(TransferMismatch, match=r"engine\.log.*nothing was kept"):
        fetch_all(LocalHost(), named)


def test_a_file_that_shrank_after_it_was_named_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"INF")
    with pytest.raises(TransferMismatch, match="nothing was kept"):
        fetch_all(LocalHost(), [(_facts(log, b"INFO up\n"), 1024)])
