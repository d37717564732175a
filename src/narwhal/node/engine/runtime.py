"""Starting, naming and stopping an engine, through the runtime its plan names.

Each runtime is one module in runtimes/ (docker, podman, native) behind one protocol
(runtimes/base.py), chosen by name in runtimes/__init__.py. These functions are what the
subcommands and the sidecar call: they take a plan or a started.json and hand it to its
runtime, so no caller branches on a runtime's name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from narwhal.node.engine.runtimes import choose
from narwhal.node.engine.runtimes.base import Ran, Started, file_tail

__all__ = ["Started", "alive", "log_source", "log_tail", "logs", "start", "stop"]


def start(plan: dict[str, Any], secrets: dict[str, str], log_path: Path,
          owned: frozenset[tuple[str, str]] = frozenset()) -> tuple[Started, Ran]:
    """Start the plan; what was started, and the runtime commands run with their wall-clock
    times (for the workstation's commands.jsonl: the record shows each host's `docker run`).
    `owned`: containers (Id, Created) the deployment record says an earlier attempt started,
    which may be removed if they hold the plan's container name."""
    env = {**os.environ, **secrets}  # secret values travel in the environment, never in argv
    return choose(plan["runtime"]).start(plan, env, log_path, owned)


def alive(started: Started) -> bool:
    return choose(started.runtime).alive(started)


def logs(started: Started, log_path: Path) -> str:
    return choose(started.runtime).logs(started, log_path)


def log_tail(started: Started | None, log_path: Path, limit: int) -> tuple[bytes, int]:
    """The last `limit` bytes of the engine's log and the log's whole length: the file a
    native engine writes (also before or without a start), or what the container runtime
    keeps of the container's output (`<runtime> logs`, both streams as they interleave)."""
    if started is None:
        return file_tail(log_path, limit)
    return choose(started.runtime).log_tail(started, log_path, limit)


def log_source(started: Started | None, log_path: Path) -> str:
    """Where log_tail read the log from, as the evidence names it."""
    return str(log_path) if started is None else choose(started.runtime).log_source(
        started, log_path)


def stop(started: Started) -> str:
    """Stop what was started, only while it is still that container or process."""
    return choose(started.runtime).stop(started)
