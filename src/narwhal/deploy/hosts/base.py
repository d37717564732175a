"""The host interface: run argv, move files with sha256 checks, own processes, forward ports.

Subclasses provide only `_exec` (and port forwarding); everything else is built on it, so local
and SSH sessions behave the same and both record every call through the same `Recorder`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from narwhal.core.errors import HostError, TransferMismatch
from narwhal.core.secret import Secret
from narwhal.deploy.hosts import commandline as cl


@dataclass(frozen=True)
class RunResult:
    alias: str
    argv: tuple[str, ...]
    exit_status: int
    stdout: bytes
    stderr: bytes
    started: float
    ended: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def check(self) -> RunResult:
        if self.exit_status != 0:
            tail = self.stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
            raise HostError(self.alias, f"`{self.argv[0]}` exited {self.exit_status}: {tail[0]}",
                            command=self.argv[0], exit_status=self.exit_status)
        return self


@dataclass(frozen=True)
class ProcessRef:
    """A process this deployment started: pid plus kernel start time, so a reused pid is not
    mistaken for ours."""

    alias: str
    pid: int
    start_ticks: int


class Recorder(Protocol):
    def record_command(self, result: RunResult, transport: str) -> None: ...


class Host(ABC):
    """One session to one physical host."""

    transport = "base"

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.recorder: Recorder | None = None
        self._home: str | None = None

    @abstractmethod
    def _exec(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None,
              env: Mapping[str, str] | None) -> tuple[int, bytes, bytes]:
        """Run argv on the host; return (exit status, stdout, stderr)."""

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None,
            timeout: float | None = 120.0, env: Mapping[str, Secret | str] | None = None,
            check: bool = False, keep_stdout: bool = True) -> RunResult:
        """Run argv and record it; `env` values (secrets included) never enter argv or records.
        With keep_stdout False the record says how many bytes came back instead of keeping
        them (file data relayed between hosts is not evidence)."""
        args = cl.check_argv(argv)
        plain_env = None if env is None else {
            k: v.reveal() if isinstance(v, Secret) else v for k, v in env.items()}
        started = time.time()
        status, out, err = self._exec(args, stdin, timeout, plain_env)
        result = RunResult(self.alias, args, status, out, err, started, time.time())
        if self.recorder is not None:
            kept = result if keep_stdout else dataclasses.replace(
                result, stdout=f"({len(out)} bytes of file data, not kept)\n".encode())
            self.recorder.record_command(kept, self.transport)
        return result.check() if check else result

    def home(self) -> str:
        """The login's $HOME, absolute: asked once per session (it cannot change under a
        login), since every gate that runs from the install directory needs it."""
        if self._home is None:
            home = self.run(cl.home(), check=True).text.strip()
            if not home.startswith("/"):
                raise HostError(self.alias, f"the login's $HOME is {home!r}, not an absolute "
                                "path")
            self._home = home
        return self._home

    # Files -----------------------------------------------------------------

    def put(self, data: bytes, path: str, *, exclusive: bool = True) -> str:
        """Write data to path via a temporary part file; verify sha256; link into place.

        With exclusive=True an existing different file at path is never replaced.
        """
        return self.put_file(data, path, exclusive=exclusive)[1]

    def put_file(self, data: bytes, path: str, *, exclusive: bool = True,
                 private_folder: bool = False) -> tuple[int, str]:
        """put, in one round trip; (inode, sha256) of the file now at path. With
        private_folder its folder is made first (cl.private_dir's way) in the same trip."""
        want = hashlib.sha256(data).hexdigest()
        part = f"{path}.part-{uuid.uuid4().hex[:12]}"
        done = self.run(cl.put_file(part, path, want, replace=not exclusive,
                                    private_folder=private_folder), stdin=data)
        if done.exit_status == 11:
            raise TransferMismatch(self.alias, f"{path}: sent sha256 {want}, host has "
                                   f"{done.text.strip()[:64]}")
        if done.exit_status == 10:
            why = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["?"]
            raise HostError(self.alias, f"{path}: could not be written ({why[0][:200]}); check "
                            "its folder exists, is writable and its disk has room")
        if done.exit_status == 12:
            raise HostError(self.alias, f"{path} is not a regular file; move it away or "
                            "choose a fresh path")
        facts = done.check().text.split()
        if len(facts) != 2 or not facts[0].isdigit():
            raise HostError(self.alias, f"{path}: unreadable answer from the host "
                            f"{done.text[:200]!r}")
        if facts[1] != want:
            raise HostError(self.alias, f"{path} already exists with other content; "
                            "move it away or choose a fresh path")
        return int(facts[0]), want

    def get(self, path: str, local: Path, *, expect_sha256: str | None = None) -> str:
        """Copy path to a new local file; verify against the host's own sha256 (and expect)."""
        data = self.run(cl.read_file(path), check=True).stdout
        got = hashlib.sha256(data).hexdigest()
        remote = self.run(cl.sha256_file(path), check=True).text.split()[0]
        for label, want in (("host", remote), ("expected", expect_sha256)):
            if want is not None and want != got:
                raise TransferMismatch(self.alias, f"{path}: {label} sha256 {want}, "
                                       f"received {got}; nothing was written locally")
        with open(local, "xb") as out:
            out.write(data)
        local.chmod(0o600)
        return got

    def stat_file(self, path: str) -> tuple[int, str] | None:
        """(inode, sha256) of a regular file, or None when it is absent or not a file."""
        result = self.run(cl.stat_file(path))
        if result.exit_status == 3:
            return None
        inode, sha = result.check().text.split()
        return int(inode), sha

    def stat_dir(self, path: str) -> int | None:
        result = self.run(cl.stat_dir(path))
        return None if result.exit_status == 3 else int(result.check().text.strip())

    # Processes ---------------------------------------------------------------

    def start_detached(self, argv: Sequence[str], log_path: str) -> ProcessRef:
        """Start argv in its own session, output to log_path; return pid and start time."""
        lines = self.run(cl.start_detached(log_path, argv), check=True).text.splitlines()
        if not lines or not lines[0].strip().isdigit():
            raise HostError(self.alias, f"starting `{argv[0]}` printed no pid: {lines[:1]!r}")
        pid = int(lines[0])
        ticks = _start_ticks(lines[1]) if len(lines) > 1 else None
        if ticks is None:
            raise HostError(self.alias, f"started `{argv[0]}` (pid {pid}) but it exited at once; "
                            f"see {log_path}")
        return ProcessRef(self.alias, pid, ticks)

    def process_start(self, pid: int) -> int | None:
        """Kernel start time of pid, or None when no such process (zombies count as gone)."""
        result = self.run(cl.proc_stat(pid))
        return _start_ticks(result.text) if result.ok else None

    def signal(self, pid: int, name: str = "TERM") -> bool:
        return self.run(["kill", f"-{name}", str(int(pid))]).ok

    # Tunnels -----------------------------------------------------------------

    @abstractmethod
    def forward(self, local_port: int, remote_host: str, remote_port: int) -> int:
        """Make remote_host:remote_port (as seen from this host) reachable on a local port."""

    def cancel_forward(  # noqa: B027 - optional hook, a no-op by default
        self, local_port: int, remote_host: str, remote_port: int
    ) -> None:
        """Undo forward; a no-op where no tunnel was needed."""

    def session_log(self) -> Path | None:
        """The connection's own log on the workstation, where one is kept (ssh's stderr):
        what it reports there about forwards (a local port already bound) is nowhere else."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release the session."""


def _start_ticks(stat_line: str) -> int | None:
    """The kernel start time from a /proc/<pid>/stat line; None for a zombie (it is gone)."""
    if stat_line.rsplit(")", 1)[1].split()[0] == "Z":
        return None
    return cl.parse_start_ticks(stat_line)
