"""`--env` must name a small regular UTF-8 file; anything else is one line and exit 2.

Issue 13 item 6, defect 8: a directory or /dev/zero printed a traceback, and a FIFO hung the
command forever.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal.core.errors import InputError
from narwhal.deploy.cli.main import main
from narwhal.deploy.inputs import load_inputs
from tests.envtext import valid_env

MAX_BYTES = 1 << 20  # the documented limit: "over the 1 MiB limit for a .env"
ROOT = Path(__file__).resolve().parents[3]
CLI = "import sys; from narwhal.deploy.cli import main; sys.exit(main(sys.argv[1:]))"


def _refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `narwhal inputs --env path`; return its stderr, checked to be problem lines only."""
    assert main(["inputs", "--env", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err and "bug in Narwhal" not in err
    lines = err.strip().splitlines()
    assert lines[0] == f"narwhal: {path}: 1 problem(s)" and len(lines) == 2, err
    return lines[1]


@pytest.mark.timeout(5)
def test_a_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(tmp_path, capsys)
    assert line == f"  - {tmp_path}: is a directory, not a regular file; point --env at the " \
                   ".env file itself (a regular file)"


def _refused_in_a_child(path: Path) -> str:
    """As _refused, in a child capped at 2 GiB: code that reads /dev/zero to its end fails
    this test with MemoryError instead of exhausting the machine."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    done = subprocess.run([sys.executable, "-c", CLI, "inputs", "--env", str(path)],
                          capture_output=True, text=True, timeout=30, check=False, cwd=ROOT,
                          preexec_fn=cap)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == f"narwhal: {path}: 1 problem(s)" and len(lines) == 2, done.stderr
    return lines[1]


def test_a_character_device_is_refused() -> None:
    assert "is a character device, not a regular file" in _refused_in_a_child(Path("/dev/zero"))


@pytest.mark.timeout(2)
def test_a_fifo_is_refused_without_blocking(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / ".env"
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), not a regular file" in _refused(fifo, capsys)


def test_a_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / ".env"
    link.symlink_to("/dev/zero")
    assert "is a character device" in _refused_in_a_child(link)


@pytest.mark.timeout(5)
def test_a_socket_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s"
    if len(str(path)) > 100:
        pytest.skip("the temporary directory's path is too long for a unix socket")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert "is a socket, not a regular file" in _refused(path, capsys)


@pytest.mark.timeout(5)
def test_an_oversize_file_is_refused_naming_the_limit(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / ".env"
    env.write_text(valid_env() + "#" * MAX_BYTES + "\n")
    env.chmod(0o600)
    line = _refused(env, capsys)
    assert "over the 1 MiB limit for a .env" in line


def test_a_file_at_the_limit_is_read(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    text = valid_env()
    env.write_text(text + "#" * (MAX_BYTES - len(text) - 1) + "\n")
    env.chmod(0o600)
    assert env.stat().st_size == MAX_BYTES
    assert len(load_inputs(env).engines) == 2


@pytest.mark.timeout(5)
def test_invalid_utf8_is_refused_with_the_byte_offset(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / ".env"
    good = valid_env().encode()
    env.write_bytes(good + b"NARWHAL_TTFT_S=\xff\n")
    env.chmod(0o600)
    line = _refused(env, capsys)
    offset = len(good) + len(b"NARWHAL_TTFT_S=")
    lineno = good.count(b"\n") + 1
    assert f"is not UTF-8 text (byte 0xff at byte offset {offset}, line {lineno})" in line


def test_an_encoded_surrogate_is_not_utf8(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_bytes(valid_env().encode() + b"NARWHAL_TTFT_S=\xed\xa0\x80\n")
    with pytest.raises(InputError, match="is not UTF-8 text"):
        load_inputs(env)


def test_a_missing_file_or_a_bad_path_is_one_problem(tmp_path: Path) -> None:
    for path in (tmp_path / "absent", tmp_path / "absent" / ".env", Path("bad\x00name"),
                 Path(__file__) / ".env"):
        with pytest.raises(InputError) as err:
            load_inputs(path)
        assert len(err.value.problems) == 1


def test_init_into_a_missing_directory_is_one_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "--env", str(tmp_path / "no" / ".env")]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "cannot create" in err
