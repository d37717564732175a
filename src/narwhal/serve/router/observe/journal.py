"""The per-request journal: one JSONL row per accepted request, written off the hot path.

The request path only appends a dict to a bounded deque (no encoding, no I/O, no lock held
across a write). A writer thread wakes a few times per second, encodes the rows it finds and
appends them in one write. If the writer falls behind by `max_rows`, new rows are dropped and
counted rather than blocking a request; `dropped` is exported as a metric and in the exit line.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

from narwhal.serve.router.jsonio import dumps

SCHEMA = "narwhal.journal"
VERSION = 1
_log = logging.getLogger("narwhal.serve.router.observe.journal")


class Journal:
    """Bounded queue + writer thread over an append-only JSONL file (mode 0600)."""

    def __init__(self, path: Path, max_rows: int, flush_interval_s: float = 0.1) -> None:
        self.path = path
        self.max_rows = max_rows
        self.flush_interval_s = flush_interval_s
        self.accepted = 0
        self.written = 0
        self.dropped = 0
        self.write_errors = 0
        self._rows: deque[dict[str, Any]] = deque()
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._fd = -1

    def open(self) -> None:
        """Create the file's folder and open it for appending; fails loudly at startup."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._writer = threading.Thread(target=self._run, name="narwhal-journal", daemon=True)
        self._writer.start()

    def record(self, row: dict[str, Any]) -> None:
        """Queue one row; never blocks. Called on the event loop."""
        if len(self._rows) >= self.max_rows:
            self.dropped += 1
            return
        self.accepted += 1
        self._rows.append(row)

    @property
    def queued(self) -> int:
        return len(self._rows)

    def _drain(self) -> None:
        rows = self._rows
        if not rows:
            return
        batch = []
        while rows:
            try:
                batch.append(rows.popleft())
            except IndexError:
                break
        head = b'{"schema":"%b","schema_version":%d,' % (SCHEMA.encode(), VERSION)
        data = b"".join(head + dumps(r)[1:] + b"\n" for r in batch)
        try:
            while data:
                n = os.write(self._fd, data)
                data = data[n:]
            self.written += len(batch)
        except OSError as exc:
            self.write_errors += 1
            _log.error("journal %s: write failed (%s); %d rows lost", self.path, exc, len(batch))

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self._drain()
        self._drain()

    def close(self) -> None:
        """Stop the writer after it has written every queued row, then sync the file."""
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=30)
        self._drain()
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1
