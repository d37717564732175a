"""A ledger run over a real sshd leaks no secret into runs/, logs or argv, and an export
leaks no private address, user name, host name or home path either."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from pathlib import Path

import pytest

from narwhal.deploy.actions.context import Context
from narwhal.deploy.cli.main import main
from narwhal.deploy.hosts.sessions import control_dir
from tests.component.conftest import write_env
from tests.component.sshd import KEY_USER, PASS_USER, PASSWORD, Sshd

API_KEY = "sk-narwhal-TEST-7f3a9c"
PRIVATE = ("10.213.0.21", "192.168.77.5")


def _cmdlines() -> list[bytes]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
    return found


class ArgvWatcher(threading.Thread):
    """Reads every process's argv while the run goes on."""

    def __init__(self, needles: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.needles = needles
        self.hits: list[bytes] = []
        self.scans = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for line in _cmdlines():
                self.hits += [n for n in self.needles if n in line]
            self.scans += 1


def _all_bytes(root: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in root.rglob("*") if p.is_file()]


def test_no_secret_or_private_value_escapes(sshd: Sshd, tmp_path: Path, monkeypatch:
                                            pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = write_env(tmp_path / ".env", sshd, NARWHAL_ENGINE_KEY=API_KEY,
                    NARWHAL_NODE_1_IP=PRIVATE[0], NARWHAL_NODE_2_IP=PRIVATE[1])
    common = ["--env", str(env), "--runs", str(tmp_path / "runs"), "--ssh-config", "/dev/null"]
    secrets = [PASSWORD.encode(), API_KEY.encode()]
    watcher = ArgvWatcher(secrets)
    watcher.start()
    try:
        assert main(["hosts", "trust", "--yes", *common]) == 0
        assert main(["hosts", "check", *common]) == 0
        ctx = Context.load(main_args(common))
        sessions = ctx.sessions()
        try:
            with ctx.ledger.attempt("discover", fingerprint=ctx.fingerprints()["discover"],
                                    hosts=sessions.roles()) as attempt:
                for alias in ("node-1", "node-2"):
                    host = sessions.get(alias)
                    with attempt.bind(host):
                        host.run(["sh", "-c", 'echo "$@"; id -un; hostname', "sh", *PRIVATE,
                                  "/home/" + KEY_USER, "/root/x", socket.gethostname(),
                                  "127.0.0.1"], check=True)
                        # A command that prints a secret: the ledger must still not keep it.
                        host.run(["cat"], stdin=API_KEY.encode(), check=True)
        finally:
            sessions.close()
    finally:
        watcher.stop.set()
        watcher.join()
    assert watcher.scans > 0 and watcher.hits == []

    runs = tmp_path / "runs"
    logs = control_dir(runs, "demo")
    for path, data in _all_bytes(runs) + _all_bytes(logs):
        for secret in secrets:
            assert secret not in data, path
    for path in runs.rglob("*"):
        mode = path.stat().st_mode & 0o777
        assert mode in (0o600, 0o700), (path, oct(mode))

    out = tmp_path / "export"
    assert main(["record", "export", "--out", str(out), *common]) == 0
    exported = _all_bytes(out)
    assert any(b"address-" in data for _, data in exported)
    forbidden = [*secrets, *(a.encode() for a in PRIVATE), b"127.0.0.1", b"/home/"]
    # Names are leaks as words, not as letters inside other text: CI's host is called `vm`,
    # which a base64 host key can hold by chance ("...Zayc/QvmVa3g...").
    names = [_word(n) for n in (KEY_USER, PASS_USER, "/root", socket.gethostname())]
    for path, data in exported:
        for needle in forbidden:
            assert needle not in data, (path, needle)
        for name in names:
            assert name.search(data) is None, (path, name.pattern)
    manifest = (out / "export-manifest.json").read_text()
    assert '"user-1"' in manifest and '"address-1"' in manifest


def _word(name: str) -> re.Pattern[bytes]:
    """name standing alone: not inside a longer run of name characters."""
    return re.compile(rb"(?<![A-Za-z0-9_-])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9_])")


def main_args(common: list[str]) -> object:
    import argparse

    from narwhal.deploy.actions.context import add_common

    parser = argparse.ArgumentParser()
    add_common(parser)
    return parser.parse_args(common)
