"""The lab state file: every namespace, route, process and fault `lab up` created.

It is written after each step, so `lab down` after a crash still finds what exists. Processes
carry their start time (clock ticks since boot) so a recycled PID is never mistaken for ours.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from narwhal.core.documents import expect, stamp

SCHEMA = "narwhal.lab-state"
VERSION = 1


class Proc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pid: int
    start_ticks: int
    what: str


class HostState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    netns: str
    init: Proc | None = None  # the host's sshd, PID 1 of the host's PID namespace
    crashed: bool = False


class LabState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    dir: str
    spec: dict[str, Any]
    netns: list[str] = []
    routes: list[str] = []
    hosts: dict[str, HostState] = {}
    hub: Proc | None = None  # the lab hub's server, in its own namespace
    faults: list[dict[str, Any]] = []
    up_seconds: float | None = None

    def save(self, path: Path) -> None:
        """Write atomically with mode 0600 (the state names the password file)."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(stamp(SCHEMA, VERSION, self.model_dump()), f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> LabState:
        document = expect(json.loads(path.read_text()), SCHEMA, VERSION)
        body = {k: v for k, v in document.items() if k not in ("schema", "schema_version")}
        return cls.model_validate(body)


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, or None if the process is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(proc: Proc) -> bool:
    return start_ticks(proc.pid) == proc.start_ticks
