"""Reading the `.env` file itself: a small regular UTF-8 file, or one clear problem.

`--env` may point anywhere. A directory, a FIFO (which would block the read forever), a device
such as /dev/zero (which never ends) or a socket is refused before it is read; the path is
opened non-blocking and the opened descriptor checked again, so a file swapped in between the
two checks is caught too. Reading stops one byte past the size limit, whatever the file claims.
Symbolic links are followed (a `.env` kept with one's dotfiles is a link), and the permission
check applies to the file it reaches.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NoReturn

from narwhal.core.errors import InputError, Problem

MAX_BYTES = 1 << 20
LIMIT_TEXT = "1 MiB"
KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO (named pipe)"),
         (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
         (stat.S_ISSOCK, "socket"))
NOT_REGULAR_FIX = "point --env at the .env file itself (a regular file)"


def _fail(path: Path, problem: str, fix: str) -> NoReturn:
    raise InputError(str(path), [Problem(str(path), problem, fix)])


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in KINDS if test(mode)), "special file")


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _read_capped(fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BYTES:
        chunk = os.read(fd, MAX_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        _fail(path, f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at byte offset "
                    f"{exc.start}, line {line})", "save it as UTF-8")


def read_env_file(path: Path) -> tuple[str, os.stat_result]:
    """The text of the `.env` at path and the status of the file read; InputError otherwise."""
    try:
        kind = _kind(os.stat(path).st_mode)
    except FileNotFoundError:
        _fail(path, "does not exist", "run `narwhal init` to write a template")
    except (OSError, ValueError) as exc:
        reason = _reason(exc) if isinstance(exc, OSError) else str(exc)
        _fail(path, f"cannot be read ({reason})", "check the path given to --env")
    if kind is not None:
        _fail(path, f"is a {kind}, not a regular file", NOT_REGULAR_FIX)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        _fail(path, f"cannot be opened ({_reason(exc)})", "check its permissions: chmod 600")
    try:
        status = os.fstat(fd)
        kind = _kind(status.st_mode)
        if kind is not None:
            _fail(path, f"is a {kind}, not a regular file", NOT_REGULAR_FIX)
        if status.st_size > MAX_BYTES:
            _fail(path, f"is {status.st_size} bytes, over the {LIMIT_TEXT} limit for a .env",
                  "point --env at the workstation .env (a few KiB of KEY=value lines)")
        try:
            data = _read_capped(fd)
        except OSError as exc:
            _fail(path, f"cannot be read ({_reason(exc)})", "check the path given to --env")
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        _fail(path, f"is over the {LIMIT_TEXT} limit for a .env",
              "point --env at the workstation .env (a few KiB of KEY=value lines)")
    return _decode(path, data), status
