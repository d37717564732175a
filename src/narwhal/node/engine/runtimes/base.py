"""What every engine runtime offers Gate C, and the one identity each reports.

A runtime is one way of running an engine on its host: a container (docker, podman) or a plain
process (native). Each builds the engine's launch argv, starts it, and later answers whether
it still runs, what it logged, and stops it. Every runtime reports the same identity, what
recovery needs to remove exactly what an attempt started and nothing else: a container by its
full Id and creation time, a native process by pid and kernel start time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from narwhal.core import launch_record as lr
from narwhal.core.transfer_path import TransferPath


@dataclass(frozen=True)
class Started:
    runtime: str
    id: str  # container Id, or the pid as text
    created: str  # container creation time, or the process's kernel start ticks

    def as_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "id": self.id, "created": self.created}


Ran = list[dict[str, Any]]  # runtime commands run, with wall-clock times, for commands.jsonl


class Runtime(Protocol):
    """One engine runtime; `choose` (runtimes/__init__.py) picks it by name."""

    name: str
    contained: bool  # a container: named, started from an image the host must hold

    def visible_devices(self, record: lr.LaunchRecord) -> dict[str, str]:
        """Environment that confines the engine to the record's GPUs (a process sees every
        GPU unless told; a container is given only its own)."""

    def container_name(self, record: lr.LaunchRecord) -> str | None:
        """The name the engine's container is given; None for a process."""

    def launch_argv(self, record: lr.LaunchRecord, env: dict[str, str],
                    path: TransferPath | None, serve: list[str]) -> list[str]:
        """The argv that starts the engine, `serve` being its `vllm serve` arguments."""

    def plan_environment(self, env: dict[str, str]) -> dict[str, str]:
        """The environment the plan hands the process itself ({} where argv carries it)."""

    def start(self, plan: dict[str, Any], env: dict[str, str], log_path: Path,
              owned: frozenset[tuple[str, str]]) -> tuple[Started, Ran]:
        """Start the plan with `env` (secrets included); what was started and what ran."""

    def alive(self, started: Started) -> bool:
        """Whether what was started is still that container or process, and running."""

    def logs(self, started: Started, log_path: Path) -> str:
        """Everything the engine logged."""

    def log_tail(self, started: Started, log_path: Path, limit: int) -> tuple[bytes, int]:
        """The log's last `limit` bytes (from a line start) and its whole length."""

    def log_source(self, started: Started, log_path: Path) -> str:
        """Where the log was read from, as the evidence names it."""

    def stop(self, started: Started) -> str:
        """Stop what was started, only while it is still that; what was done, in words."""


LOG_CHUNK = 64 << 10


def chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(LOG_CHUNK):
        yield chunk


def keep_tail(pieces: Iterable[bytes], limit: int) -> tuple[bytes, int]:
    """At most the last `limit` bytes of a stream, from a line start when it was cut, and the
    stream's whole length; never more than about twice `limit` held at once (a long-running
    engine's log can be far larger than what is kept)."""
    tail, total = bytearray(), 0
    for chunk in pieces:
        total += len(chunk)
        tail += chunk
        if len(tail) > 2 * limit:
            del tail[:-limit]
    if len(tail) <= limit:
        return bytes(tail), total
    kept = tail[len(tail) - limit:]
    if tail[len(tail) - limit - 1:len(tail) - limit] != b"\n":  # a partial first line
        newline = kept.find(b"\n")
        kept = kept[newline + 1:] if newline >= 0 else kept
    return bytes(kept), total


def file_tail(log_path: Path, limit: int) -> tuple[bytes, int]:
    """The tail of the log file a native engine writes (also before or without a start)."""
    if not log_path.exists():
        return b"", 0
    with log_path.open("rb") as f:
        return keep_tail(chunks(f), limit)
