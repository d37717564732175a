"""The tunnel log of a trial (tunnel.jsonl): every SSH forward it opened and cancelled.

The runbook keeps "Tunnel logs" for the capacity trial, whose first correction is "resolve
local port conflicts": a trial that could not reach the router, or whose forward broke, is
read from here. One row per forward request (open or cancel): when, how long it took, the
workstation's local port, the remote host:port as the router host sees it, and its result
with ssh's own error text. Then what the connection logged meanwhile on the workstation
(the master's stderr: a local port already bound is reported only there), one row a line,
bounded to its last STDERR_BYTES.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from narwhal.core.documents import canonical_json
from narwhal.deploy.ledger.attempt import iso

STDERR_BYTES = 64 << 10


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


class TunnelLog:
    """Rows of one host's forwards; `session_log` is the connection's own log, if it keeps
    one (Host.session_log), read from where it stood when this log began."""

    def __init__(self, alias: str, transport: str, session_log: Path | None) -> None:
        self.alias, self.transport = alias, transport
        self.rows: list[dict[str, Any]] = []
        self._session_log = session_log
        self._offset = _size(session_log)

    def add(self, event: str, started: float, local_port: int, remote: tuple[str, int],
            error: str = "") -> None:
        """One forward request (`open` or `cancel`) and how it went: an empty `error` is ok."""
        self.rows.append({
            "event": event, "at": iso(started), "duration_s": round(time.time() - started, 6),
            "host": self.alias, "transport": self.transport,
            "local": f"127.0.0.1:{int(local_port)}", "remote": f"{remote[0]}:{int(remote[1])}",
            "ok": not error, "error": error})

    def session_lines(self) -> list[str]:
        """What the connection's log gained since this log began (all of it when it shrank:
        the connection was opened again and its log started afresh), last STDERR_BYTES."""
        path = self._session_log
        size = _size(path)
        if path is None or size == 0:
            return []
        start = self._offset if size >= self._offset else 0
        start = max(start, size - STDERR_BYTES)
        try:
            with path.open("rb") as f:
                f.seek(start)
                data = f.read(size - start)
        except OSError as exc:
            return [f"(the connection's log {path.name} cannot be read: {exc.strerror})"]
        return data.decode("utf-8", "replace").splitlines()

    def jsonl(self) -> bytes:
        """The rows, then the connection's own lines (`ssh-stderr`, which carry no time of
        their own: `read_at` is when they were read), as JSON lines."""
        read_at = iso(time.time())
        rows = [*self.rows, *({"event": "ssh-stderr", "read_at": read_at, "host": self.alias,
                               "line": line} for line in self.session_lines() if line.strip())]
        return b"".join(canonical_json(r).encode() + b"\n" for r in rows)
