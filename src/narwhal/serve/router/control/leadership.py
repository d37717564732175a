"""This router's standing in the fleet: primary (holds the lease), standby, or fenced.

The request path asks one question, `time.monotonic() < leadership.until`: only a router
whose lease is valid places requests. `until` is moved forward by renewals that run in a
worker thread (file I/O never blocks the event loop) and drops to zero the moment a renewal
finds the lease gone (another router took it: this one is fenced and shuts down). A renewal
that is late for any reason, a stalled disk or a stalled loop, lets `until` pass on its own,
so a router never serves on a lease it cannot prove it still holds.

A standby (`--standby-of URL`) polls the primary's handoff document (`GET /narwhal/handoff`)
and copies the state it would need on takeover (ejections and failure streaks, held engines)
onto its own engines, and tries to acquire the lease on every poll. The lease is the only way
in: a standby never serves while the primary's lease is live, whatever the primary's URL
answers, and takes over at most one lease period plus one poll after the primary dies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from narwhal.serve.router.control.lease import (
    Claimant,
    Grant,
    Lease,
    LeaseHeld,
    LeaseLost,
    LeaseRecord,
)
from narwhal.serve.router.jsonio import loads
from narwhal.serve.router.request.deadlines import Deadlines
from narwhal.serve.router.request.legs import LegFailed, LegTimedOut, exchange, request_bytes
from narwhal.serve.router.request.upstream import EnginePool, EngineUnreachable
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.settings import ControllerPolicy

_log = logging.getLogger("narwhal.serve.router.control.leadership")
HANDOFF_SCHEMA = "narwhal.handoff"
HANDOFF_VERSION = 1


class Leadership:
    """Holds, renews, follows and gives up the controller lease for one router process."""

    def __init__(self, lease: Lease, claimant: Claimant, policy: ControllerPolicy,
                 engines: Sequence[Engine], *, standby_of: str | None = None,
                 ops_key: bytes = b"") -> None:
        self.lease = lease
        self.claimant = claimant
        self.policy = policy
        self.engines = tuple(engines)
        self.standby_of = standby_of
        self._ops_key = ops_key  # the operator key a primary with tenant keys asks for
        self.role = "standby" if standby_of else "primary"
        self.until = 0.0  # monotonic; the request path serves only before this instant
        self.grant: Grant | None = None
        self.fenced_reason = ""
        self.took_over_at: float | None = None
        self.handoffs_applied = 0
        self.handoff_errors = 0
        self.last_handoff_at = 0.0
        self.renewals = 0
        self.last_epoch = 0
        self.holder_seen: LeaseRecord | None = None  # the holder as last learned (ours or not)
        self.on_fenced: Callable[[], None] = lambda: None
        self._warned_handoff = False

    # -- holding ----------------------------------------------------------------------------
    def claim(self) -> None:
        """Acquire at startup (primary); raises LeaseHeld naming the holder."""
        self._granted(self.lease.acquire(self.claimant))

    def _granted(self, grant: Grant) -> None:
        self.grant = grant
        self.until = grant.valid_until
        self.last_epoch = grant.epoch
        self.holder_seen = grant.record

    @property
    def epoch(self) -> int:
        return self.grant.epoch if self.grant is not None else 0

    async def keep(self) -> None:
        """Renew until cancelled; on loss, fence this router and ask it to stop."""
        while self.grant is None:
            await asyncio.sleep(self.policy.handoff_poll_s)
        while True:
            await asyncio.sleep(self.policy.renew_every_s)
            grant = self.grant
            assert grant is not None
            try:
                self._granted(await asyncio.to_thread(self.lease.renew, grant))
                self.renewals += 1
            except LeaseLost as exc:
                # Our epoch is over either way. If nobody else holds the lease (this router
                # stalled past its expiry and no standby stepped in) take a new epoch and go
                # on; if someone does, that router is the controller now.
                self.until = 0.0
                try:
                    self._granted(await asyncio.to_thread(self.lease.acquire, self.claimant))
                    _log.warning("lease lapsed (%s); re-acquired at epoch %d", exc, self.epoch)
                except (LeaseHeld, OSError) as again:
                    if isinstance(again, LeaseHeld):
                        self.holder_seen = again.record
                    self.fence(fence_reason(str(exc), again))
                    return
            except OSError as exc:  # transient: retry until our own deadline passes
                if time.monotonic() >= grant.valid_until:
                    self.fence(f"could not renew the lease before it expired: {exc}")
                    return
                _log.warning("lease renewal failed, retrying: %s", exc)

    def fence(self, reason: str) -> None:
        self.until = 0.0
        self.role = "fenced"
        self.fenced_reason = reason
        _log.error("fenced, no longer placing requests: %s", reason)
        self.on_fenced()

    async def release(self) -> None:
        """Give the lease up (shutdown): a standby may take over at its next poll."""
        grant, self.grant = self.grant, None
        self.until = 0.0
        if grant is not None and self.role == "primary":
            try:
                await asyncio.to_thread(self.lease.release, grant)
            except OSError as exc:
                _log.warning("could not release the lease (it will expire): %s", exc)

    # -- standing by ------------------------------------------------------------------------
    async def follow(self, deadlines: Deadlines) -> None:
        """Standby: copy the primary's handoff state and try the lease on every poll."""
        assert self.standby_of is not None
        parts = urlsplit(self.standby_of)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        pool = EnginePool(host, port, connect_timeout_s=self.policy.handoff_poll_s,
                          keepalive_s=60.0)
        req = request_bytes(b"GET", b"/narwhal/handoff", f"{host}:{port}".encode(), b"", None,
                            self._ops_key)
        timeout = max(self.policy.handoff_poll_s, 0.05)
        try:
            while self.role == "standby":
                try:
                    status, payload = await exchange(pool, req, timeout, deadlines)
                    if status == 200:
                        self.apply_handoff(loads(payload))
                    else:
                        self.handoff_errors += 1
                except (EngineUnreachable, LegFailed, LegTimedOut, ValueError):
                    self.handoff_errors += 1
                try:
                    grant = await asyncio.to_thread(self.lease.acquire, self.claimant)
                except LeaseHeld as held:
                    self.holder_seen = held.record
                    await asyncio.sleep(self.policy.handoff_poll_s)
                    continue
                except OSError as exc:
                    _log.warning("standby could not read the lease: %s", exc)
                    await asyncio.sleep(self.policy.handoff_poll_s)
                    continue
                self._granted(grant)
                self.role = "primary"
                self.took_over_at = time.time()
                _log.warning("standby took over as primary at lease epoch %d", grant.epoch)
        finally:
            pool.close_all()

    def handoff(self) -> dict[str, Any]:
        """The document a standby follows: this router's lease and per-engine state."""
        return {
            "schema": HANDOFF_SCHEMA, "schema_version": HANDOFF_VERSION,
            "epoch": self.epoch, "holder_id": self.claimant.holder_id, "url": self.claimant.url,
            "role": self.role, "written_at": time.time(),
            "engines": [{"id": e.id, "ejected": e.ejected, "ejected_reason": e.ejected_reason,
                         "ejections": e.ejections, "fail_streak": e.fail_streak}
                        for e in self.engines],
        }

    def apply_handoff(self, doc: Any) -> None:
        """Copy a primary's engine state onto ours; a malformed document is counted, not used."""
        if not isinstance(doc, dict) or doc.get("schema") != HANDOFF_SCHEMA \
                or doc.get("schema_version") != HANDOFF_VERSION or doc.get("role") != "primary":
            self.handoff_errors += 1
            if not self._warned_handoff:
                self._warned_handoff = True
                _log.warning("%s does not serve a primary's %s v%d document",
                             self.standby_of, HANDOFF_SCHEMA, HANDOFF_VERSION)
            return
        by_id = {e.id: e for e in self.engines}
        for row in doc.get("engines") or ():
            engine = by_id.get(str(row.get("id"))) if isinstance(row, dict) else None
            if engine is None:
                continue
            engine.ejected = bool(row.get("ejected"))
            engine.ejected_reason = str(row.get("ejected_reason") or "")
            if type(row.get("ejections")) is int:
                engine.ejections = row["ejections"]
            if type(row.get("fail_streak")) is int:
                engine.fail_streak = row["fail_streak"]
        self.handoffs_applied += 1
        self.last_handoff_at = time.time()

    def state(self) -> dict[str, Any]:
        quorum = self.policy.quorum
        seen = self.holder_seen
        return {
            "role": self.role, "epoch": self.epoch, "backend": self.lease.backend,
            "lease_path": str(self.policy.lease_path) if quorum is None else None,
            "lease_sidecars": list(quorum.lease_urls) if quorum is not None else None,
            "holder": None if seen is None else {
                "url": seen.url, "pid": seen.pid, "host": seen.host, "epoch": seen.epoch,
                "holder_id": seen.holder_id},
            "lease_ttl_s": self.policy.lease_ttl_s, "holder_id": self.claimant.holder_id,
            "pid": self.claimant.pid,  # this router's own process (Gate G tells them apart)
            "valid_for_s": round(max(0.0, self.until - time.monotonic()), 3),
            "standby_of": self.standby_of, "took_over_at": self.took_over_at,
            "fenced_reason": self.fenced_reason or None, "renewals": self.renewals,
            "handoffs_applied": self.handoffs_applied, "handoff_errors": self.handoff_errors,
        }


def fence_reason(lost: str, again: Exception) -> str:
    """Why a router whose renewal failed is fenced: the renewal's words, then the re-acquire's
    unless they only name again the holder the renewal already named."""
    if isinstance(again, LeaseHeld) and f"router {again.record.url} " in lost:
        return lost
    return f"{lost}; {again}"
