"""Processes for the overhead bench: start pinned, stop by PID, read CPU time from /proc.

CPU time is utime+stime over every thread of a process and of all its descendants (vllm-router
runs its Rust core under a Python launcher), read from /proc/<pid>/stat.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from narwhal.lab.ports import free_port as free_port  # one picker for every harness
from narwhal.lab.ports import free_ports as free_ports

TICK = os.sysconf("SC_CLK_TCK")


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so a bench that is told to stop runs its `finally` and
    stops the engines and routers it started instead of leaving them running."""
    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """pid and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                children.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_split(pids: Sequence[int]) -> tuple[float, float]:
    """User and kernel CPU seconds of these processes (utime, stime from /proc)."""
    user = system = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            f = _stat(pid)
            user += int(f[11]) / TICK
            system += int(f[12]) / TICK
    return user, system


def cpu_seconds(pids: Sequence[int]) -> float:
    return sum(cpu_split(pids))


def rss_kib(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds over all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        vals = [int(v) for v in fh.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return (sum(vals) - idle) / TICK, sum(vals) / TICK


def http_status(port: int, path: str, method: str = "GET", body: bytes | None = None,
                timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_status(port: int, path: str, timeout: float, proc: subprocess.Popen[bytes]) -> float:
    """Seconds until GET path answered 200; raises if the process exits or time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with {proc.returncode}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if http_status(port, path, timeout=1.0)[0] == 200:
                return time.monotonic() - t0
        time.sleep(0.05)
    raise TimeoutError(f"127.0.0.1:{port}{path} not 200 after {timeout:.0f}s")


@dataclass
class Owned:
    """A process this bench started; stopped by its PID only."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[int]:
        return descendants(self.pid)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)


def start(name: str, argv: Sequence[str], *, cpu: str, log: Path, port: int = 0,
          env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Owned:
    """Start argv pinned to `cpu` (taskset), output to `log`."""
    full_env = {**os.environ, **(env or {})}
    with log.open("ab") as fh:
        proc = subprocess.Popen(["taskset", "-c", cpu, *argv], stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, cwd=cwd)
    return Owned(name, proc, log, port)
