"""Starting, naming and stopping an engine: a container (docker, podman) or a process (native).

Every runtime reports the same identity, what recovery needs to remove exactly what an
attempt started and nothing else: a container by its full Id and creation time, a native
process by pid and kernel start time.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from narwhal.node.engine.errors import RuntimeError_

START_TIMEOUT_S = 120


@dataclass(frozen=True)
class Started:
    runtime: str
    id: str  # container Id, or the pid as text
    created: str  # container creation time, or the process's kernel start ticks

    def as_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "id": self.id, "created": self.created}


STOP_GRACE_S = 20.0


def _start_ticks(pid: int) -> str:
    """The kernel start time of a live pid; a zombie (exited, not yet reaped) counts as gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        raise ProcessLookupError(pid)
    return fields[19]


def inspect(runtime: str, ref: str) -> tuple[str, str, bool] | None:
    """(Id, Created, running) of a container, or None when there is none by that ref."""
    done = subprocess.run([runtime, "inspect", "--type", "container", "--format",
                           "{{.Id}}|{{.Created}}|{{.State.Running}}", ref],
                          capture_output=True, text=True, timeout=60, check=False)
    parts = done.stdout.strip().split("|")
    if done.returncode != 0 or len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2] == "true"


def start(plan: dict[str, Any], secrets: dict[str, str], log_path: Path,
          owned: frozenset[tuple[str, str]] = frozenset()
          ) -> tuple[Started, list[dict[str, Any]]]:
    """Start the plan; what was started, and the runtime commands run with their wall-clock
    times (for the workstation's commands.jsonl: the record shows each host's `docker run`).

    A container already holding the plan's name is removed first only when its (Id, Created)
    is in `owned`: one the deployment record says an earlier attempt started, left behind
    when this run dir lost track of it (the host was reinstalled or its disk restored).
    Any other container of that name refuses the start, named."""
    env = {**os.environ, **secrets}  # secret values travel in the environment, never in argv
    runtime = plan["runtime"]
    if runtime == "native":
        with log_path.open("ab") as log:
            proc = subprocess.Popen(plan["argv"], env={**env, **plan["environment"]},
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, cwd=plan["run_dir"])
        return Started("native", str(proc.pid), _start_ticks(proc.pid)), []
    ran: list[dict[str, Any]] = []
    existing = inspect(runtime, plan["container_name"])
    if existing is not None and existing[:2] in owned:
        t0 = time.time()
        argv = [runtime, "rm", "-f", existing[0]]
        removed = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        ran.append({"argv": argv, "start": t0, "end": time.time(),
                    "exit_status": removed.returncode})
        existing = inspect(runtime, plan["container_name"])
    if existing is not None:
        raise RuntimeError_(f"a container named {plan['container_name']} already exists "
                            f"({existing[0][:12]}) and the deployment record does not own it; "
                            "stop it (`narwhal-engine stop`) or remove it")
    t0 = time.time()
    done = subprocess.run(plan["argv"], env=env, capture_output=True, text=True,
                          timeout=START_TIMEOUT_S, check=False)
    ran.append({"argv": plan["argv"], "start": t0, "end": time.time(),
                "exit_status": done.returncode})
    if done.returncode != 0:
        raise RuntimeError_(f"{runtime} run exited {done.returncode}: "
                            f"{done.stderr.strip()[-500:]}")
    found = inspect(runtime, done.stdout.strip())
    if found is None:
        raise RuntimeError_(f"{runtime} run printed {done.stdout.strip()[:80]!r}, which it "
                            "cannot inspect")
    return Started(runtime, found[0], found[1]), ran


def alive(started: Started) -> bool:
    if started.runtime == "native":
        try:
            return _start_ticks(int(started.id)) == started.created
        except OSError:
            return False
    found = inspect(started.runtime, started.id)
    return found is not None and found[:2] == (started.id, started.created) and found[2]


def logs(started: Started, log_path: Path) -> str:
    if started.runtime == "native":
        return log_path.read_text(errors="replace") if log_path.exists() else ""
    done = subprocess.run([started.runtime, "logs", started.id], capture_output=True, text=True,
                          timeout=60, check=False)
    return done.stdout + done.stderr


LOG_CHUNK = 64 << 10


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(LOG_CHUNK):
        yield chunk


def _keep_tail(chunks: Iterable[bytes], limit: int) -> tuple[bytes, int]:
    """At most the last `limit` bytes of a stream, from a line start when it was cut, and the
    stream's whole length; never more than about twice `limit` held at once (a long-running
    engine's log can be far larger than what is kept)."""
    tail, total = bytearray(), 0
    for chunk in chunks:
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


def log_tail(started: Started | None, log_path: Path, limit: int) -> tuple[bytes, int]:
    """The last `limit` bytes of the engine's log and the log's whole length: the file a
    native engine writes (also before or without a start), or what the container runtime
    keeps of the container's output (`<runtime> logs`, both streams as they interleave)."""
    if started is None or started.runtime == "native":
        if not log_path.exists():
            return b"", 0
        with log_path.open("rb") as f:
            return _keep_tail(_chunks(f), limit)
    with subprocess.Popen([started.runtime, "logs", started.id], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        if proc.stdout is None:
            raise RuntimeError_(f"{started.runtime} logs gave no output stream")
        got = _keep_tail(_chunks(proc.stdout), limit)
        proc.wait(timeout=60)
    return got


def stop(started: Started) -> str:
    """Stop what was started, only while it is still that container or process."""
    if started.runtime == "native":
        if not alive(started):
            return "already gone"
        os.killpg(int(started.id), 15)
        deadline = time.monotonic() + STOP_GRACE_S  # "stopped" means gone, not signalled
        while alive(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(started):
            os.killpg(int(started.id), 9)
            return "killed: it did not exit within the grace period"
        return "stopped"
    found = inspect(started.runtime, started.id)
    if found is None:
        return "already gone"
    if found[:2] != (started.id, started.created):
        return "kept: the container with this Id is not the one started"
    subprocess.run([started.runtime, "rm", "-f", started.id], capture_output=True,
                   timeout=60, check=False)
    return "removed"
