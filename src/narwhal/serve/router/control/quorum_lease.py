"""The controller lease held by a strict majority of the fleet's attestation sidecars.

Each sidecar keeps at most one live grant, and grants only epochs above every epoch it has
granted (node/attest/lease.py). A router holds the lease while a strict majority of the
sidecars hold its grant at its epoch. Why that is safe:

- **Majorities overlap.** Any two strict majorities of the same N sidecars share one, and that
  one holds a single live grant, so two routers cannot both hold a majority at once.
- **The router's validity ends first.** `Grant.valid_until` is taken from the router's monotonic
  clock *before* the first request of the round is sent, and shortened by a margin for clock
  rate drift (`DRIFT` of the ttl, plus `MARGIN_S`). Every sidecar starts its ttl on receipt,
  later than that instant, on a clock that runs at nearly the same rate, so the router stops
  placing requests before any sidecar of its majority may grant the lease to another router.
  Monotonic clocks are slewed by NTP by at most 500 ppm; 2 % leaves room for far worse.
- **Epochs fence.** Acquisition takes an epoch above the highest any reachable sidecar has
  granted; an expired grant is never renewed. A router that was cut off or paused past its
  lease cannot serve again on its old epoch: its renewal is refused, and it must win a new
  epoch from a majority, which it cannot while another router holds one.

Every round asks all sidecars at once (a small thread pool), each with a timeout well under a
renewal period, so one dead sidecar never delays the renewal past the others' answers. The
file lease (lease.py) remains the backend of fleets without sidecars.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

from narwhal.core.lease_wire import HolderView
from narwhal.core.secret import Secret
from narwhal.serve.router.control.lease import Claimant, Grant, LeaseHeld, LeaseLost, LeaseRecord
from narwhal.serve.router.control.lease_calls import Answer, call

DRIFT = 0.02  # fraction of the ttl the router gives up for sidecar clocks running fast
MARGIN_S = 0.01  # and a constant for the time between reading the clock and sending
ACQUIRE_ROUNDS = 3  # epoch races (another router acquiring at once) retried this often


class LeaseUnavailable(OSError):
    """Too few sidecars answered to decide: transient for a running router (it retries until
    its own validity ends), a failed start for one that never held the lease."""


class QuorumLease:
    """The `Lease` protocol against N sidecars' /v1/lease routes; a strict majority decides."""

    def __init__(self, urls: Sequence[str], key: Secret, deployment: str, ttl_s: float,
                 *, timeout_s: float | None = None) -> None:
        if not urls:
            raise ValueError("a quorum lease needs sidecars")
        if ttl_s <= 0:
            raise ValueError("lease ttl must be positive")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self.key = key
        self.deployment = deployment
        self.ttl_s = ttl_s
        self.majority = len(self.urls) // 2 + 1
        # Renewals run every ttl/4: an answer later than ttl/8 is as good as none.
        self.timeout_s = timeout_s if timeout_s is not None else min(2.0, max(0.05, ttl_s / 8))
        self.backend = f"quorum of {len(self.urls)} sidecars"
        self._pool = ThreadPoolExecutor(max_workers=2 * len(self.urls),
                                        thread_name_prefix="narwhal-quorum")

    # -- one round --------------------------------------------------------------------------
    def _round(self, verb: str | None, body: dict[str, Any] | None,
               *, until_majority: bool = False) -> list[Answer]:
        """Every sidecar's answer; one that has not answered by the deadline counts as none.
        `until_majority` returns as soon as a majority has granted: what a straggler says
        then cannot undo it (two majorities overlap), and a hung sidecar must not delay the
        next renewal by its whole timeout."""
        futures = [self._pool.submit(call, url, verb, body, self.key, self.timeout_s)
                   for url in self.urls]
        deadline = time.monotonic() + 2 * self.timeout_s + 0.05
        pending = set(futures)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            if until_majority and sum(f.result().granted for f in futures
                                      if f not in pending) >= self.majority:
                break
        return [f.result() if f not in pending else
                Answer(url, 0, None, f"{url} did not answer within {2 * self.timeout_s:.2f} s")
                for f, url in zip(futures, self.urls, strict=True)]

    def _short(self, what: str, answers: list[Answer]) -> LeaseUnavailable:
        usable = sum(a.reply is not None for a in answers)
        problems = "; ".join(a.problem for a in answers if a.reply is None) or "none"
        return LeaseUnavailable(
            f"could not {what}: {usable} of {len(answers)} sidecars answered, "
            f"{self.majority} needed ({problems})")

    def _safe_until(self, started: float) -> float:
        return started + self.ttl_s * (1 - DRIFT) - MARGIN_S

    def _body(self, holder_id: str, epoch: int, **more: Any) -> dict[str, Any]:
        return {"deployment": self.deployment, "holder_id": holder_id, "epoch": epoch, **more}

    # -- Lease ------------------------------------------------------------------------------
    def acquire(self, claimant: Claimant) -> Grant:
        """Win a new epoch from a majority; LeaseHeld naming the live holder, or
        LeaseUnavailable when too few sidecars answer."""
        for _ in range(ACQUIRE_ROUNDS):
            states = self._round(None, None)
            read = [a for a in states if a.reply is not None]
            if len(read) < self.majority:
                raise self._short("read the lease", states)
            held = self._majority_holder(read)
            if held is not None and held.holder_id != claimant.holder_id:
                raise LeaseHeld(_record(held))
            epoch = max(a.reply.highest_epoch for a in read if a.reply is not None) + 1
            started = time.monotonic()
            answers = self._round("acquire", self._body(
                claimant.holder_id, epoch, ttl_s=self.ttl_s, url=claimant.url,
                pid=claimant.pid, host=claimant.host), until_majority=True)
            granted = [a for a in answers if a.granted]
            for a in answers:
                if a.refused and a.reply is not None and a.reply.reason == "deployment":
                    self._release_at(granted, claimant.holder_id, epoch)
                    raise LeaseUnavailable(
                        f"{a.url} is a sidecar of deployment {a.reply.deployment!r}, not "
                        f"{self.deployment!r}: fix controller.quorum in the fleet document")
            ahead = max((a.reply.highest_epoch for a in answers
                         if a.refused and a.reply is not None), default=0)
            if len(granted) >= self.majority and ahead <= epoch:
                now = time.time()
                return Grant(epoch, self._safe_until(started), LeaseRecord(
                    claimant.holder_id, claimant.url, claimant.pid, claimant.host, epoch,
                    now, now + self.ttl_s))
            self._release_at(granted, claimant.holder_id, epoch)  # a partial grant blocks others
            if ahead >= epoch:
                continue  # another router bid this epoch or above meanwhile: read and bid again
            other = self._named_holder(answers, claimant.holder_id)
            if other is not None:
                raise LeaseHeld(_record(other))
            raise self._short("acquire the lease", answers)
        raise LeaseUnavailable(f"epochs kept moving during {ACQUIRE_ROUNDS} acquisition rounds "
                               "(another router is acquiring at the same time)")

    def renew(self, grant: Grant) -> Grant:
        """Extend our grant at a majority; LeaseLost once it is provably gone, LeaseUnavailable
        while too few sidecars answer to tell."""
        started = time.monotonic()
        if started >= grant.valid_until:
            raise LeaseLost(f"the lease of epoch {grant.epoch} expired before it was renewed")
        holder_id = grant.record.holder_id
        answers = self._round("renew", self._body(holder_id, grant.epoch, ttl_s=self.ttl_s),
                              until_majority=True)
        other = self._named_holder(answers, holder_id)
        if other is not None:
            raise LeaseLost(f"the lease moved on (epoch {grant.epoch} is fenced): "
                            f"{_record(other).describe(time.time())}")
        for a in answers:
            if a.reply is not None and a.reply.highest_epoch > grant.epoch:
                raise LeaseLost(f"the lease moved on (epoch {grant.epoch} is fenced): {a.url} "
                                f"has granted epoch {a.reply.highest_epoch}")
        if sum(a.granted for a in answers) >= self.majority:
            now = time.time()
            record = LeaseRecord(holder_id, grant.record.url, grant.record.pid,
                                 grant.record.host, grant.epoch, grant.record.acquired_at,
                                 now + self.ttl_s)
            return Grant(grant.epoch, self._safe_until(started), record)
        refused = [a for a in answers if a.refused]
        if len(refused) >= self.majority:
            reasons = "; ".join(f"{a.url}: {a.reply.error}" for a in refused
                                if a.reply is not None)
            raise LeaseLost(f"a majority of sidecars refused to renew epoch {grant.epoch} "
                            f"({reasons})")
        raise self._short(f"renew epoch {grant.epoch}", answers)

    def release(self, grant: Grant) -> None:
        """Give the grant up at every sidecar that holds it (they keep the epoch)."""
        answers = self._round("release", self._body(grant.record.holder_id, grant.epoch))
        if sum(a.reply is not None for a in answers) < self.majority:
            raise self._short(f"release epoch {grant.epoch}", answers)

    def holder(self) -> LeaseRecord | None:
        """The live holder a majority of sidecars agree on, or None."""
        states = self._round(None, None)
        read = [a for a in states if a.reply is not None]
        if len(read) < self.majority:
            raise self._short("read the lease", states)
        held = self._majority_holder(read)
        return _record(held) if held is not None else None

    # -- counting ---------------------------------------------------------------------------
    def _majority_holder(self, answers: list[Answer]) -> HolderView | None:
        views = [a.reply.holder for a in answers if a.reply is not None and a.reply.holder]
        counts = Counter((v.holder_id, v.epoch) for v in views)
        for (holder_id, epoch), count in counts.most_common(1):
            if count >= self.majority:
                return next(v for v in views if (v.holder_id, v.epoch) == (holder_id, epoch))
        return None

    @staticmethod
    def _named_holder(answers: list[Answer], me: str) -> HolderView | None:
        """The live holder other than `me` that refusals name (the highest epoch among them)."""
        views = [a.reply.holder for a in answers if a.refused and a.reply is not None
                 and a.reply.holder is not None and a.reply.holder.holder_id != me]
        return max(views, key=lambda v: v.epoch, default=None)

    def _release_at(self, granted: list[Answer], holder_id: str, epoch: int) -> None:
        body = self._body(holder_id, epoch)
        futures = [self._pool.submit(call, a.url, "release", body, self.key, self.timeout_s)
                   for a in granted]
        wait(futures, timeout=2 * self.timeout_s + 0.05)


def _record(view: HolderView) -> LeaseRecord:
    now = time.time()
    return LeaseRecord(view.holder_id, view.url, view.pid, view.host, view.epoch,
                       now - view.held_s, now + view.seconds_left)
