"""SshHost against a real sshd on loopback: auth, multiplexing, pinning, transfers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from narwhal.core.errors import HostError, HostKeyChanged, HostUnreachable, TransferMismatch
from narwhal.core.secret import Secret
from narwhal.deploy.hosts.ssh import SshHost
from narwhal.deploy.hosts.trust import scan
from narwhal.deploy.inputs.destination import parse_destination
from tests.component.sshd import KEY_USER, PASS_USER, PASSWORD, Sshd, free_port


def pin(sshd: Sshd, path: Path, host: str = "127.0.0.1") -> None:
    keys = scan(parse_destination(f"ssh://{KEY_USER}@{host}:{sshd.port}"), 5)
    path.write_text("".join(k.line + "\n" for k in keys))


def key_host(sshd: Sshd, tmp_path: Path, alias: str = "node-1") -> SshHost:
    known = tmp_path / "known_hosts"
    if not known.exists():
        pin(sshd, known)
    control = tmp_path / "cm"
    control.mkdir(exist_ok=True, mode=0o700)
    return SshHost(alias, parse_destination(f"ssh://{KEY_USER}@127.0.0.1:{sshd.port}"),
                   known_hosts=known, control_dir=control, key=str(sshd.client_key),
                   connect_timeout=5, ssh_config="/dev/null")


def test_key_auth_runs_argv_as_the_key_user(sshd: Sshd, tmp_path: Path) -> None:
    host = key_host(sshd, tmp_path)
    try:
        result = host.run(["sh", "-c", 'echo "$1"; id -un', "x", "a b;$(c)"], check=True)
    finally:
        host.close()
    assert result.text.splitlines() == ["a b;$(c)", KEY_USER]


def test_password_auth_goes_through_sshpass_without_argv(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    pin(sshd, known)
    control = tmp_path / "cm"
    control.mkdir(mode=0o700)
    host = SshHost("node-2", parse_destination(f"ssh://{PASS_USER}@127.0.0.1:{sshd.port}"),
                   known_hosts=known, control_dir=control,
                   password=Secret(PASSWORD, "NARWHAL_NODE_2_SSH_PASSWORD"),
                   connect_timeout=5, ssh_config="/dev/null")
    try:
        assert host.run(["id", "-un"], check=True).text.strip() == PASS_USER
    finally:
        host.close()


def test_wrong_password_is_an_authentication_error(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    pin(sshd, known)
    host = SshHost("node-2", parse_destination(f"ssh://{PASS_USER}@127.0.0.1:{sshd.port}"),
                   known_hosts=known, control_dir=tmp_path, password=Secret("wrong-pw"),
                   connect_timeout=5, ssh_config="/dev/null")
    with pytest.raises(HostError, match="authentication failed") as err:
        host.run(["true"])
    assert "wrong-pw" not in str(err.value)


def test_commands_from_several_threads_at_first_contact_share_one_master(
        sshd: Sshd, tmp_path: Path) -> None:
    """Engines sharing a host start from parallel threads: the first command of each must not
    stop the master another thread is still starting (that killed it mid-start: `ssh exited
    -15`)."""
    host = key_host(sshd, tmp_path)
    gate = threading.Barrier(6)
    results: list[str] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        gate.wait(10)
        time.sleep(0.02 * i)  # staggered: some arrive while the first master is starting
        try:
            results.append(host.run(["echo", str(i)], check=True).text.strip())
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        master = host.master_pid
    finally:
        host.close()
    assert not errors and sorted(results) == [str(i) for i in range(6)], errors
    assert master is not None


def test_twenty_commands_reuse_one_master_well_under_two_seconds(sshd: Sshd,
                                                                 tmp_path: Path) -> None:
    host = key_host(sshd, tmp_path)
    try:
        host.run(["true"], check=True)  # opens the master
        started = time.monotonic()
        for i in range(20):
            assert host.run(["echo", str(i)], check=True).text.strip() == str(i)
        elapsed = time.monotonic() - started
    finally:
        host.close()
    assert elapsed < 2.0, f"20 multiplexed commands took {elapsed:.2f} s"


def test_changed_host_key_blocks_with_both_fingerprints(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    pin(sshd, known)
    old = scan(parse_destination(f"ssh://x@127.0.0.1:{sshd.port}"), 5)[0].fingerprint
    sshd.rekey()
    new = scan(parse_destination(f"ssh://x@127.0.0.1:{sshd.port}"), 5)[0].fingerprint
    host = key_host(sshd, tmp_path)
    with pytest.raises(HostKeyChanged) as err:
        host.run(["true"])
    message = str(err.value)
    assert old in message and new in message and old != new
    assert "node-1" in message and "out of band" in message


def test_unreachable_host_fails_clearly_within_the_connect_timeout(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = SshHost("node-9", parse_destination(f"ssh://{KEY_USER}@127.0.0.1:{free_port()}"),
                   known_hosts=known, control_dir=tmp_path, connect_timeout=3,
                   ssh_config="/dev/null")
    started = time.monotonic()
    with pytest.raises(HostUnreachable, match="node-9: cannot connect"):
        host.run(["true"])
    assert time.monotonic() - started < 3 + 2


def test_put_and_get_verify_sha256(sshd: Sshd, tmp_path: Path) -> None:
    host = key_host(sshd, tmp_path)
    remote = f"{sshd.root}/home/{KEY_USER}/payload.bin"
    data = bytes(range(256)) * 64
    try:
        sha = host.put(data, remote)
        local = tmp_path / "back.bin"
        assert host.get(remote, local) == sha
        assert local.read_bytes() == data
        assert oct(local.stat().st_mode & 0o777) == "0o600"
        with pytest.raises(TransferMismatch, match="expected sha256"):
            host.get(remote, tmp_path / "bad.bin", expect_sha256="0" * 64)
        assert not (tmp_path / "bad.bin").exists()
        with pytest.raises(HostError, match="already exists"):
            host.put(b"other content", remote)
        assert host.run(["cat", remote]).stdout == data
    finally:
        host.close()


def test_put_is_one_round_trip_and_refuses_what_it_cannot_place(sshd: Sshd,
                                                                  tmp_path: Path) -> None:
    """One command puts a file (a fleet of 32 hosts pays one SSH start per file, not four);
    a missing folder, a directory in the way and a replaced file each say what happened, and
    no part file is ever left."""
    host = key_host(sshd, tmp_path)
    home = f"{sshd.root}/home/{KEY_USER}"
    try:
        seen: list[str] = []
        host.recorder = type("R", (), {"record_command": lambda _s, r, _t: seen.append(
            r.argv[0])})()
        inode, sha = host.put_file(b"first\n", f"{home}/one.txt")
        assert len(seen) == 1
        assert host.stat_file(f"{home}/one.txt") == (inode, sha)
        host.recorder = None
        assert host.put_file(b"first\n", f"{home}/one.txt") == (inode, sha)  # same bytes pass
        assert host.put(b"second\n", f"{home}/one.txt", exclusive=False) != sha
        assert host.run(["cat", f"{home}/one.txt"]).stdout == b"second\n"
        with pytest.raises(HostError, match=r"could not be written.*folder exists"):
            host.put(b"x", f"{home}/no-such-folder/x.txt")
        host.run(["mkdir", f"{home}/in-the-way"], check=True)
        with pytest.raises(HostError, match="not a regular file"):
            host.put(b"x", f"{home}/in-the-way")
        left = host.run(["sh", "-c", f"ls -a {home} | grep -c part- || true"]).text.strip()
        assert left == "0"
    finally:
        host.close()
