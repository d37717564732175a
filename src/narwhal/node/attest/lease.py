"""The sidecar's share of the controller lease: at most one live grant, and epochs that only rise.

A router holds the fleet's controller lease while a strict majority of the sidecars hold a live
grant for it (serve/router/control/quorum_lease.py). Two majorities always share a sidecar, so the whole
lease is safe if each sidecar keeps two rules, which is all this keeper does:

- **One live grant at a time.** A grant is {holder, URL, pid, host, epoch} with an expiry on
  this sidecar's own monotonic clock. Another holder is refused while it is live; an expired
  grant is never renewed (its holder must acquire a new epoch, so a router that was cut off or
  paused cannot come back on its old fencing epoch).
- **Epochs rise.** A grant needs an epoch above every epoch this sidecar has granted. The
  highest is persisted (fsynced, atomic) in the run dir together with the current grant, so a
  restarted sidecar never grants a lower or equal epoch, and honours the grant it held for
  one full ttl from its restart: the grant cannot have had longer left, and a restart must
  not free a lease its holder still counts as held.

Pure logic over an injected clock; every verb holds one lock, so the HTTP server's threads
may call it concurrently.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from narwhal.core.documents import stamp
from narwhal.core.lease_wire import TTL_MAX_S, TTL_MIN_S
from narwhal.core.private_file import write_private_json

STATE_SCHEMA = "narwhal.sidecar-lease-state"
STATE_VERSION = 1
STATE_FILE = "controller-lease.json"


@dataclass(frozen=True, slots=True)
class Holder:
    """Who asks for a grant."""

    holder_id: str
    url: str
    pid: int
    host: str


@dataclass(frozen=True, slots=True)
class Grant:
    """The grant this sidecar holds for one router at one epoch."""

    holder: Holder
    epoch: int
    ttl_s: float
    granted: float  # monotonic, this sidecar's clock
    expires: float

    def live(self, now: float) -> bool:
        return now < self.expires

    def view(self, now: float) -> dict[str, Any]:
        """The grant as the wire shows it (core/lease_wire.HolderView)."""
        return {**asdict(self.holder), "epoch": self.epoch,
                "seconds_left": round(max(0.0, self.expires - now), 3),
                "held_s": round(max(0.0, now - self.granted), 3)}


class Refused(Exception):
    """A verb this sidecar will not perform; `reason` is one of core/lease_wire.Reason."""

    def __init__(self, reason: str, message: str, holder: Grant | None) -> None:
        self.reason = reason
        self.holder = holder  # the live grant that stands in the way, when there is one
        super().__init__(message)


def check_ttl(ttl_s: float) -> None:
    if not TTL_MIN_S <= ttl_s <= TTL_MAX_S:  # NaN fails this too
        raise ValueError(f"ttl {ttl_s!r} s is outside {TTL_MIN_S:g}..{TTL_MAX_S:g} s")


class Keeper:
    """Grants, renews and releases this sidecar's share of the controller lease."""

    def __init__(self, state_path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.state_path = state_path
        self._clock = clock
        self._lock = threading.Lock()
        self._highest = 0
        self._grant: Grant | None = None
        self._load()

    # -- persistence ------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            raw = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ValueError(self._unreadable(f"cannot be read ({exc})")) from None
        try:
            if raw["schema"] != STATE_SCHEMA or raw["schema_version"] != STATE_VERSION:
                raise ValueError(f"is not {STATE_SCHEMA} v{STATE_VERSION}")
            highest, grant = raw["highest_epoch"], raw["grant"]
            if type(highest) is not int or highest < 0:
                raise ValueError("has no usable highest_epoch")
            self._highest = highest
            if grant is not None:
                now = self._clock()
                ttl = float(grant["ttl_s"])
                check_ttl(ttl)
                self._grant = Grant(Holder(str(grant["holder_id"]), str(grant["url"]),
                                           int(grant["pid"]), str(grant["host"])),
                                    int(grant["epoch"]), ttl, now, now + ttl)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(self._unreadable(f"is malformed ({exc})")) from None

    def _unreadable(self, why: str) -> str:
        return (f"controller lease state {self.state_path} {why}; this sidecar will not grant "
                "epochs it cannot prove are new. Move the file aside only when no router of "
                "this fleet is running")

    def _commit(self, highest: int, grant: Grant | None) -> None:
        """Write the new state, then adopt it: a grant this sidecar could not make durable is
        never given (OSError reaches the caller and the old state stands)."""
        record = None if grant is None else {
            **asdict(grant.holder), "epoch": grant.epoch, "ttl_s": grant.ttl_s}
        write_private_json(self.state_path, stamp(STATE_SCHEMA, STATE_VERSION, {
            "highest_epoch": highest, "grant": record}))
        self._highest, self._grant = highest, grant

    # -- verbs ------------------------------------------------------------------------------
    def acquire(self, holder: Holder, epoch: int, ttl_s: float) -> Grant:
        """Grant `epoch` to `holder` when no other holder's grant is live and the epoch is new."""
        check_ttl(ttl_s)
        with self._lock:
            now = self._clock()
            current = self._grant
            if current is not None and current.live(now) \
                    and current.holder.holder_id != holder.holder_id:
                raise Refused("held", f"held by {current.holder.url} at epoch {current.epoch}",
                              current)
            if epoch <= self._highest:
                raise Refused("stale_epoch", f"epoch {epoch} is not above {self._highest}, the "
                              "highest this sidecar has granted", self._live(now))
            grant = Grant(holder, epoch, ttl_s, now, now + ttl_s)
            self._commit(epoch, grant)
            return grant

    def renew(self, holder_id: str, epoch: int, ttl_s: float) -> Grant:
        """Extend the live grant of `holder_id` at `epoch` to `ttl_s` from now."""
        check_ttl(ttl_s)
        with self._lock:
            now = self._clock()
            current = self._grant
            if current is None or current.holder.holder_id != holder_id:
                live = self._live(now)
                if live is not None:
                    raise Refused("held", f"held by {live.holder.url} at epoch {live.epoch}", live)
                raise Refused("no_grant", f"no grant for {holder_id} at epoch {epoch}", None)
            if current.epoch != epoch:
                raise Refused("superseded", f"epoch {epoch} was superseded by epoch "
                              f"{current.epoch} of the same holder", self._live(now))
            if not current.live(now):
                raise Refused("expired", f"the grant of epoch {epoch} expired "
                              f"{now - current.expires:.3f} s ago; acquire a new epoch", None)
            renewed = replace(current, ttl_s=max(ttl_s, current.ttl_s), expires=now + ttl_s)
            if ttl_s > current.ttl_s:  # a restart must honour the longest ttl it was given
                self._commit(self._highest, renewed)
            self._grant = renewed
            return renewed

    def release(self, holder_id: str, epoch: int) -> bool:
        """Drop the grant of `holder_id` at `epoch`; False when it is not the current one."""
        with self._lock:
            current = self._grant
            if current is None or current.holder.holder_id != holder_id or current.epoch != epoch:
                return False
            self._commit(self._highest, None)
            return True

    def state(self) -> tuple[Grant | None, int, float]:
        """The live grant (or None), the highest epoch granted, and this clock's now."""
        with self._lock:
            now = self._clock()
            return self._live(now), self._highest, now

    def _live(self, now: float) -> Grant | None:
        return self._grant if self._grant is not None and self._grant.live(now) else None
