"""Gate B's relay run for real on this machine: two LocalHosts (two install folders), the
relay server and fetch started through the same command lines the hosts run, over loopback.

What an operator relies on: a child host ends with the parent's bytes, checked, private and
owned by the attempt (so recovery can remove them); nothing a parent serves but the files
listed by digest; a hostile or slow parent never leaves a half file or a wrong one, and
whatever a child could not pull is left for the workstation to send; no server outlives the
gate.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.deploy.gates.install_relay import RelayTree, pull
from narwhal.deploy.hosts import commandline as cl
from narwhal.deploy.hosts.local import LocalHost
from narwhal.deploy.ledger import Ledger
from narwhal.deploy.package import prepared as prep

BIG = 200 * 1024


def _file(folder: Path, name: str, size: int, fill: bytes) -> prep.SendFile:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fill * (size // len(fill)))
    return prep.SendFile(name, path, hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture
def source(tmp_path: Path) -> list[prep.SendFile]:
    local = tmp_path / "workstation"
    return [_file(local, "revision.bundle", BIG, b"bundle!!"),
            _file(local, "wheelhouse/a-1.0-py3-none-any.whl", BIG * 2, b"wheel-a"),
            _file(local, "wheelhouse/b-1.0-py3-none-any.whl", BIG, b"wheel-b!"),
            _file(local, "runs/r/env/engine-1.env", 100, b"x")]  # small: sent, not relayed


def _place(base: Path, files: list[prep.SendFile]) -> None:
    """The parent's files in place, as the workstation's send leaves them."""
    for f in files:
        assert f.local is not None
        (base / f.remote).parent.mkdir(parents=True, exist_ok=True)
        (base / f.remote).write_bytes(f.local.read_bytes())


def _serve(base: Path, files: list[prep.SendFile], idle_s: float = 60.0) -> tuple[int, str]:
    """A relay server started from the argv a host runs; (its pid, its URL)."""
    pairs = [(str(f.sha256), f.remote) for f in files]
    server = subprocess.Popen(cl.relay_server("127.0.0.1", "t0ken", idle_s, 120.0, str(base),
                                              pairs), stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    said, port = server.stdout.readline().split()
    server.stdout.close()
    assert said == "port"
    return server.pid, f"http://127.0.0.1:{port}/t0ken"


@pytest.fixture
def servers() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in pids:  # only the servers this test started
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)


def _fetch(url: str, base: Path, listing: str, timeout_s: float = 5.0,
           deadline_s: float = 60.0) -> list[str]:
    base.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(cl.relay_fetch(url, str(base), timeout_s, deadline_s),
                          input=listing, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _listing(files: list[prep.SendFile]) -> str:
    return "".join(f"{f.sha256} {f.local.stat().st_size if f.local else 0} {f.remote}\n"
                   for f in files)


def test_a_child_pulls_its_parents_files_checked_private_and_owned(
        tmp_path: Path, source: list[prep.SendFile], servers: list[int]) -> None:
    parent, child = LocalHost("node-1"), LocalHost("node-2")
    bases = {"node-1": tmp_path / "h1", "node-2": tmp_path / "h2"}
    for b in bases.values():
        (b / "wheelhouse").mkdir(parents=True)
    _place(bases["node-1"], source)
    packages = [prep.HostPackage("node-1", ["engine-1"], files=list(source)),
                prep.HostPackage("node-2", ["engine-2"], files=list(source))]
    tree = RelayTree(packages, {"node-1": "127.0.0.1", "node-2": "127.0.0.1"})
    ledger = Ledger(tmp_path / "runs", "demo").ensure()
    said: list[str] = []
    with ledger.attempt("install", fingerprint={}, hosts={}, deployment_revision="") as attempt:
        tree.serve(parent, attempt, str(bases["node-1"]))
        servers.extend(s.process.pid for s in tree.serving)
        tree.release("node-1")
        done, created = pull(tree, child, attempt, str(bases["node-2"]), packages[1],
                             lambda alias, what: said.append(f"{alias}: {what}"))
        tree.stop()
        folder = attempt.folder
    assert created == 3 and done == {f.remote for f in source[:3]}
    assert said == ["node-2: pulling 3 files from node-1"]
    for f in source[:3]:
        got = bases["node-2"] / f.remote
        assert got.read_bytes() == (bases["node-1"] / f.remote).read_bytes()
        assert stat.S_IMODE(got.stat().st_mode) == 0o600
    assert not (bases["node-2"] / source[3].remote).exists()  # small: left to the send
    owned = [json.loads(line) for line in (folder / "owned.jsonl").read_text().splitlines()]
    # the server is the attempt's, so `recover install` ends it if the gate never does
    assert [(r["host"], r["pid"]) for r in owned if r["kind"] == "process"] == [
        ("node-1", tree.serving[0].process.pid)]
    assert {(r["path"], r["inode"], r["sha256"]) for r in owned if r["kind"] == "file"} == {
        (str(bases["node-2"] / f.remote), (bases["node-2"] / f.remote).stat().st_ino, f.sha256)
        for f in source[:3]}
    assert not list(bases["node-2"].rglob("*.part-relay-*"))
    _wait_gone(tree.serving[0].process.pid)  # stopped at the gate's end


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        if stat_line.rsplit(")", 1)[1].split()[0] == "Z":
            return
        assert time.monotonic() < deadline, f"relay server {pid} still runs"
        time.sleep(0.1)


def test_a_rerun_keeps_what_is_there_and_refuses_a_different_file_leaving_it(
        tmp_path: Path, source: list[prep.SendFile], servers: list[int]) -> None:
    _place(tmp_path / "h1", source)
    pid, url = _serve(tmp_path / "h1", source[:3])
    servers.append(pid)
    child = tmp_path / "h2"
    (child / "wheelhouse").mkdir(parents=True)
    (child / "revision.bundle").write_bytes(b"the operator's own file")
    _place(child, source[1:2])
    assert _fetch("-", child, _listing(source[:3])) == [  # a rerun's check: no parent asked
        "refused - revision.bundle", "kept - wheelhouse/a-1.0-py3-none-any.whl",
        "missing - wheelhouse/b-1.0-py3-none-any.whl"]
    lines = _fetch(url, child, _listing(source[:3]))
    assert lines[0] == "refused - revision.bundle"
    assert lines[1] == "kept - wheelhouse/a-1.0-py3-none-any.whl"
    assert lines[2].startswith("created ") and lines[2].endswith("b-1.0-py3-none-any.whl")
    assert (child / "revision.bundle").read_bytes() == b"the operator's own file"


def test_the_server_answers_listed_digests_only(
        tmp_path: Path, source: list[prep.SendFile], servers: list[int]) -> None:
    _place(tmp_path / "h1", source)
    (tmp_path / "h1" / "secret").write_text("not listed")
    pid, url = _serve(tmp_path / "h1", source[:1])
    servers.append(pid)
    root = url.rsplit("/", 1)[0]
    digest = str(source[0].sha256)
    served = urllib.request.urlopen(f"{url}/{digest}", timeout=5).read()  # noqa: S310
    assert served == source[0].local.read_bytes()  # type: ignore[union-attr]
    for path in (f"/t0ken/{source[1].sha256}", f"/other/{digest}", "/t0ken/", "/",
                 "/t0ken/../secret", f"/t0ken/{digest}/x", "/t0ken/secret"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(root + path, timeout=5)  # noqa: S310
        assert refused.value.code == 404, path


def test_an_idle_server_ends_itself(tmp_path: Path, source: list[prep.SendFile],
                                    servers: list[int]) -> None:
    _place(tmp_path / "h1", source)
    pid, _ = _serve(tmp_path / "h1", source[:1], idle_s=1.0)
    servers.append(pid)
    _wait_gone(pid)


class Hostile:
    """A parent that answers every request with `reply` then holds the connection for
    `hold_s` (0: closes): too many bytes, wrong bytes, or a stall."""

    def __init__(self, reply: bytes, hold_s: float = 0.0) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.asked = 0
        self.reply, self.hold_s = reply, hold_s
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/t"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.asked += 1
            conn.recv(65536)
            conn.sendall(self.reply)
            time.sleep(self.hold_s)
            conn.close()


def _one(size: int, content: bytes) -> str:
    return f"{hashlib.sha256(content).hexdigest()} {size} f.bin\n"


@pytest.mark.parametrize("body,why", [
    (b"A" * 1000, "longer"),  # more than the listing declares: never read without bound
    (b"B" * 500, "digest"),  # the declared size, other bytes
    (b"A" * 400, "shorter")])
def test_a_parent_sending_wrong_bytes_leaves_no_file(tmp_path: Path, body: bytes,
                                                      why: str) -> None:
    bad = Hostile(b"HTTP/1.0 200 OK\r\n\r\n" + body)
    lines = _fetch(bad.url, tmp_path / "child", _one(500, b"A" * 500))
    assert lines == [f"failed {why} f.bin"]
    assert list((tmp_path / "child").iterdir()) == []


def test_a_stalled_parent_fails_within_the_read_timeout_and_the_rest_are_not_asked(
        tmp_path: Path) -> None:
    slow = Hostile(b"HTTP/1.0 200 OK\r\nContent-Length: 500\r\n\r\n" + b"A" * 10, hold_s=30)
    listing = _one(500, b"A" * 500) + _one(500, b"C" * 500).replace("f.bin", "g.bin")
    started = time.monotonic()
    lines = _fetch(slow.url, tmp_path / "child", listing, timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert lines == ["failed TimeoutError f.bin", "failed TimeoutError g.bin"]
    assert slow.asked == 1 and list((tmp_path / "child").iterdir()) == []


def test_an_unreachable_parent_fails_every_file_for_the_workstation_to_send(
        tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens
    lines = _fetch(f"http://127.0.0.1:{port}/t", tmp_path / "child",
                   _one(500, b"A" * 500) + _one(5, b"hello").replace("f.bin", "g.bin"))
    assert [line.split()[0] for line in lines] == ["failed", "failed"]
