"""The controller lease: exactly one router places requests for a fleet, fenced by an epoch.

A lease is a small record (holder id, URL, pid, host, epoch, expiry) behind four verbs:
`acquire`, `renew`, `release`, `holder`. The epoch rises by one on every acquisition, so a
router that was paused past its expiry and wakes up finds a higher epoch on renewal and knows
it has been replaced (`LeaseLost`): it must stop placing requests at once. That is the fence.
A crashed holder needs no cleanup: its lease simply expires and the next `acquire` takes it.

`FileLease` keeps the record in one JSON file. Every read-modify-write happens under an
exclusive `flock` on a sibling `.lock` file, and the record is replaced by an atomic rename of
a temporary file (fsynced, except on renewal: see `_write`), so a reader never sees half a record and a crash mid-write leaves
the old one. Expiry is wall-clock time, because the processes that share the file may sit on
different hosts of a shared file system; the holder also keeps a monotonic deadline of its own
(`Grant.valid_until`) taken *before* each write, so a clock step cannot stretch its lease.
The quorum-of-sidecars backend (quorum_lease.py) sits behind the same `Lease` protocol.
The verbs block (file I/O); the router calls them from a worker thread, never the event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

SCHEMA = "narwhal.lease"
VERSION = 1


@dataclass(frozen=True, slots=True)
class Claimant:
    """Who asks for the lease: a process-unique id, the URL it serves on, pid and host."""

    holder_id: str
    url: str
    pid: int
    host: str

    @staticmethod
    def this_process(url: str) -> Claimant:
        return Claimant(holder_id=f"{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}",
                        url=url, pid=os.getpid(), host=socket.gethostname())


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the lease document says: the current (or last) holder and until when it holds."""

    holder_id: str
    url: str
    pid: int
    host: str
    epoch: int
    acquired_at: float
    expires_at: float  # wall clock; 0 after a release

    def live(self, now: float) -> bool:
        return self.expires_at > now

    def describe(self, now: float) -> str:
        """One human line naming the holder and when its lease lapses."""
        left = self.expires_at - now
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires_at))
        return (f"router {self.url} (pid {self.pid} on host {self.host}, epoch {self.epoch}) "
                f"holds the lease until {when} ({left:.1f} s from now unless it renews)")


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease this process holds: its epoch and the monotonic instant it stops being safe."""

    epoch: int
    valid_until: float  # time.monotonic() deadline
    record: LeaseRecord


class LeaseHeld(Exception):
    """Another live holder has the lease."""

    def __init__(self, record: LeaseRecord) -> None:
        self.record = record
        super().__init__(record.describe(time.time()))


class LeaseLost(Exception):
    """Renewal found the lease gone to another holder (or expired): stop serving now."""


class Lease(Protocol):
    """The controller lease seam; every implementation raises the two exceptions above, and
    OSError for what may pass (an unreadable file, sidecars that do not answer)."""

    backend: str  # what holds it, for /narwhal/state: "file", "quorum of 3 sidecars"

    def acquire(self, claimant: Claimant) -> Grant: ...

    def renew(self, grant: Grant) -> Grant: ...

    def release(self, grant: Grant) -> None: ...

    def holder(self) -> LeaseRecord | None: ...


class FileLease:
    """The lease in one JSON file, guarded by flock and replaced by atomic rename."""

    def __init__(self, path: Path, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError("lease ttl must be positive")
        self.path = path
        self.ttl_s = ttl_s
        self.backend = "file"
        self._lock_path = path.with_name(path.name + ".lock")
        self._lock_fd = -1
        self._thread_lock = threading.Lock()  # flock on one shared fd does not exclude threads

    # -- file plumbing ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # The lock file stays open for the life of the lease: a renewal then needs only the
        # descriptors of one read and one write, which the router keeps in reserve
        # (descriptors.py), never a fresh one for the lock too.
        with self._thread_lock:
            if self._lock_fd < 0:
                self._lock_fd = os.open(self._lock_path,
                                        os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fd = self._lock_fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _read(self) -> LeaseRecord | None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise OSError(f"lease file {self.path} is unreadable ({exc}); remove it only when "
                          "no router is running on this fleet") from None
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA or raw.get("schema_version") != VERSION:
            raise OSError(f"lease file {self.path} is not a {SCHEMA} v{VERSION} document")
        try:
            return LeaseRecord(**{k: raw[k] for k in LeaseRecord.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise OSError(f"lease file {self.path} lacks a field ({exc})") from None

    def _write(self, record: LeaseRecord, durable: bool = True) -> None:
        """Replace the record atomically. `durable=False` (renewals) skips the fsync: a renewal
        lost to a power cut leaves the previous, fsynced record, whose expiry is only earlier,
        so nothing unsafe can follow; and a renewal runs several times a second, where the
        fsync was most of an idle router's CPU."""
        body: dict[str, Any] = {"schema": SCHEMA, "schema_version": VERSION, **asdict(record)}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(body, sort_keys=True).encode())
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    # -- Lease ------------------------------------------------------------------------------
    def acquire(self, claimant: Claimant) -> Grant:
        with self._locked():
            started = time.monotonic()
            now = time.time()
            current = self._read()
            if current is not None and current.live(now) and current.holder_id != claimant.holder_id:
                raise LeaseHeld(current)
            epoch = (current.epoch if current is not None else 0) + 1
            record = LeaseRecord(claimant.holder_id, claimant.url, claimant.pid, claimant.host,
                                 epoch, now, now + self.ttl_s)
            self._write(record)
            return Grant(epoch, started + self.ttl_s, record)

    def renew(self, grant: Grant) -> Grant:
        with self._locked():
            started = time.monotonic()
            now = time.time()
            current = self._read()
            if current is None or current.epoch != grant.epoch \
                    or current.holder_id != grant.record.holder_id:
                who = current.describe(now) if current is not None else "nobody holds it"
                raise LeaseLost(f"the lease moved on (epoch {grant.epoch} is fenced): {who}")
            if not current.live(now) or started >= grant.valid_until:
                raise LeaseLost(f"the lease of epoch {grant.epoch} expired before it was renewed")
            record = LeaseRecord(current.holder_id, current.url, current.pid, current.host,
                                 current.epoch, current.acquired_at, now + self.ttl_s)
            self._write(record, durable=False)
            return Grant(grant.epoch, started + self.ttl_s, record)

    def release(self, grant: Grant) -> None:
        """Give the lease up now (keeping the epoch, so the next holder's is higher)."""
        with self._locked():
            current = self._read()
            if current is None or current.epoch != grant.epoch \
                    or current.holder_id != grant.record.holder_id:
                return  # already someone else's: nothing of ours to release
            self._write(LeaseRecord(current.holder_id, current.url, current.pid, current.host,
                                    current.epoch, current.acquired_at, 0.0))

    def holder(self) -> LeaseRecord | None:
        """The current live holder, or None when the lease is free (never held, released, expired)."""
        with self._locked():
            current = self._read()
        return current if current is not None and current.live(time.time()) else None
