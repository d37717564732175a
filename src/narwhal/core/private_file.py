"""Writing a document a tool produces (profile store, calibration, preflight evidence): whole
or not at all, readable by its owner only.

The text goes to a unique temporary file beside the target (mode 0600 from the start), is
fsynced and renamed over the target, and the folder is fsynced, so a reader sees the old file
or the new one, never half of either, and a crash leaves no partial document.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_private_json(path: Path, document: dict[str, Any]) -> None:
    """`document` as indented JSON (NaN refused), written by `write_private`."""
    write_private(path, json.dumps(document, indent=1, allow_nan=False) + "\n")
