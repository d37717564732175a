"""The one place that writes evidence: private directories, exclusive 0600 files, redaction.

Evidence is written once (O_EXCL) so nothing already recorded can be overwritten; append-only
logs are opened O_APPEND. Every byte passes through the redactor first, so a secret that some
command echoed still never reaches the disk.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from narwhal.core.documents import canonical_json
from narwhal.core.errors import LedgerError
from narwhal.core.secret import MASK, Secret

FILE_MODE = 0o600
DIR_MODE = 0o700


class Redactor:
    """Replaces every known secret value with the mask, in bytes and in text."""

    def __init__(self, secrets: Iterable[Secret] = ()) -> None:
        self._values = sorted({s.reveal().encode() for s in secrets if s.reveal()}, key=len,
                              reverse=True)

    def bytes(self, data: bytes) -> bytes:
        for value in self._values:
            data = data.replace(value, MASK.encode())
        return data

    def text(self, data: str) -> str:
        return self.bytes(data.encode()).decode("utf-8", errors="surrogateescape")


def private_dir(path: Path) -> Path:
    """Create path and every missing parent as 0700; an existing leaf is tightened to 0700."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(folder, DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


class EvidenceWriter:
    """Writes the files of one deployment record; safe to share between threads."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        # One append at a time: a short write is finished by a second write(), which O_APPEND
        # alone would let another thread's row slip in front of (and NFS does not make O_APPEND
        # atomic at all).
        self._append_lock = threading.Lock()

    def create(self, path: Path, data: bytes) -> bytes:
        """Write a new file exclusively with mode 0600; an existing file is an error.

        Returns the bytes as written (secrets masked), for digests without a re-read."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:
            raise LedgerError(f"{path} already exists; evidence is never overwritten") from None
        clean = self.redactor.bytes(data)
        with os.fdopen(fd, "wb") as out:
            out.write(clean)
            out.flush()
            os.fsync(out.fileno())
        return clean

    def create_json(self, path: Path, document: Any) -> bytes:
        return self.create(path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())

    def append_row(self, path: Path, row: dict[str, Any]) -> None:
        """Append one whole JSON line; the file is created 0600 on first use."""
        line = memoryview(self.redactor.bytes((canonical_json(row) + "\n").encode()))
        with self._append_lock:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
            try:
                while line:
                    line = line[os.write(fd, line):]
                os.fsync(fd)
            finally:
                os.close(fd)

    def replace_json(self, path: Path, document: Any) -> None:
        """Atomically replace an index file (not evidence): unique temp file, fsync, rename."""
        data = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(self.redactor.bytes(data))
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file written by append_row; a missing file has no rows."""
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LedgerError(f"{path}:{number} is not JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise LedgerError(f"{path}:{number} is not an object")
        rows.append(row)
    return rows
