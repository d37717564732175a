"""One attempt at one gate: its folder, its command log, what it owns, its artifacts, verdict."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.core.documents import sha256_bytes, stamp
from narwhal.core.errors import GateBlocked, LedgerError
from narwhal.deploy.hosts.base import Host, ProcessRef, RunResult
from narwhal.deploy.ledger.evidence import EvidenceWriter, private_dir

if TYPE_CHECKING:
    from narwhal.deploy.ledger.store import Ledger

ATTEMPT_SCHEMA = "narwhal.attempt"


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


class Attempt:
    """Records everything one gate attempt does; hosts bound to it record their own commands."""

    def __init__(self, ledger: Ledger, gate: str, attempt_id: str, folder: Path,
                 start_doc: dict[str, Any]) -> None:
        self.ledger = ledger
        self.gate = gate
        self.id = attempt_id
        self.folder = folder
        self.writer: EvidenceWriter = ledger.writer
        self.start_doc = start_doc
        self.artifacts: dict[str, str] = {}
        self._seq = 0
        self._hosts: list[Host] = []
        private_dir(folder / "out")

    # Recording ---------------------------------------------------------------

    def record_command(self, result: RunResult, transport: str) -> None:
        self._seq += 1
        row: dict[str, Any] = {
            "seq": self._seq, "host": result.alias, "transport": transport,
            "argv": list(result.argv), "start": iso(result.started), "end": iso(result.ended),
            "duration_s": round(result.ended - result.started, 6),
            "exit_status": result.exit_status,
        }
        for name, data in (("stdout", result.stdout), ("stderr", result.stderr)):
            rel = f"out/{self._seq:05d}.{name}" if data else None
            clean = self.writer.create(self.folder / rel, data) if rel else b""
            row[name] = {"bytes": len(clean), "sha256": sha256_bytes(clean), "path": rel}
        self.writer.append_row(self.folder / "commands.jsonl", row)

    @contextmanager
    def bind(self, *hosts: Host) -> Iterator[None]:
        """Every call through these hosts is recorded in this attempt while bound."""
        previous = [h.recorder for h in hosts]
        for host in hosts:
            host.recorder = self
        try:
            yield
        finally:
            for host, rec in zip(hosts, previous, strict=True):
                host.recorder = rec

    def _own(self, row: dict[str, Any]) -> None:
        self.writer.append_row(self.folder / "owned.jsonl", {"at": iso(time.time()), **row})

    # What the attempt creates ---------------------------------------------------

    def create_file(self, host: Host, path: str, data: bytes) -> str:
        """Create a new file on host (never replacing one) and own it by inode and sha256."""
        with self.bind(host):
            sha = host.put(data, path, exclusive=True)
            facts = host.stat_file(path)
        if facts is None:
            raise LedgerError(f"{host.alias}: {path} vanished right after it was written")
        self._own({"kind": "file", "host": host.alias, "path": path, "inode": facts[0],
                   "sha256": facts[1]})
        return sha

    def make_dir(self, host: Host, path: str) -> None:
        """Create a new directory (it must not exist) and own it by inode."""
        with self.bind(host):
            host.run(["mkdir", "-m", "700", "--", path], check=True)
            inode = host.stat_dir(path)
        self._own({"kind": "dir", "host": host.alias, "path": path, "inode": inode})

    def start_process(self, host: Host, argv: Sequence[str], log_path: str) -> ProcessRef:
        """Start a detached process and own it by pid and kernel start time."""
        with self.bind(host):
            ref = host.start_detached(argv, log_path)
        self._own({"kind": "process", "host": host.alias, "pid": ref.pid,
                   "start_ticks": ref.start_ticks, "argv0": argv[0]})
        return ref

    def add_artifact(self, name: str, data: bytes) -> Path:
        """Write a gate artifact into the attempt folder; its sha256 goes into attempt.json."""
        if "/" in name or name.startswith(".") or name in ("attempt.json", "start.json",
                                                            "commands.jsonl", "owned.jsonl"):
            raise LedgerError(f"artifact name {name!r} is reserved or not a plain file name")
        path = self.folder / name
        self.artifacts[name] = sha256_bytes(self.writer.create(path, data))
        return path

    def block(self, cause: str) -> None:
        """Stop the attempt as blocked; the ledger records it before anything else happens."""
        raise GateBlocked(self.gate, cause)

    # Verdict ----------------------------------------------------------------------

    def finish(self, verdict: str, cause: str = "") -> dict[str, Any]:
        ended = time.time()
        doc = stamp(ATTEMPT_SCHEMA, 1, {
            **self.start_doc, "verdict": verdict, "cause": cause, "ended": iso(ended),
            "duration_s": round(ended - float(self.start_doc["started_epoch"]), 3),
            "commands": self._seq, "artifacts": dict(sorted(self.artifacts.items())),
        })
        self.writer.create_json(self.folder / "attempt.json", doc)
        return doc
