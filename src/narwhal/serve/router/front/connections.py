"""Every open client connection: the cap on them, each peer's share, and the read timeouts.

A router that runs out of file descriptors cannot renew its controller lease, open a leg to an
engine or write its journal, so client connections never take every descriptor: their cap
comes from the descriptor budget (descriptors.py). At the cap, or when one peer address holds
more than its share, a new connection does not wait and is not refused while an idle one
exists: the idlest connection (of that peer first, else of all) is closed to make room, so
sockets held open and silent cost their holder its oldest sockets, not other clients their
service. Only when every connection is busy answering is the newcomer refused with a 503;
it then leaves the count and lingers (at most `descriptors.LINGERING` at once) until its
client has read the 503 and closed, so the refusal is not lost to a reset.

A sweep every quarter of the shortest timeout closes what holds a slot without progress: a
head not complete within `header_timeout_s` (slowloris) or a body within `body_timeout_s`
(408), a connection that sent nothing within `header_timeout_s`, and a keep-alive connection
idle for `idle_timeout_s`. Nothing here runs per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator

from narwhal.serve.router.front.descriptors import LINGERING, LimitWatch
from narwhal.serve.router.front.front import ClientConnection
from narwhal.serve.router.settings import ClientLimits

_log = logging.getLogger("narwhal.serve.router.front.connections")
_WATCH_PERIOD_S = 0.25  # how often the descriptor limit is read again (a getrlimit call)

_FULL = ("the router is at its connection limit and every connection is answering a request "
         "(serving.max_connections); retry shortly")


class Connections:
    """The open client connections of one router (front.Registry)."""

    def __init__(self, limits: ClientLimits, watch: LimitWatch | None = None) -> None:
        self.limits = limits
        self._watch = watch
        self._open: set[ClientConnection] = set()
        self._by_peer: dict[str, set[ClientConnection]] = {}
        self._lingering: set[ClientConnection] = set()  # refused at the cap, read by now
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # new connections refused because every slot was busy
        self.timed_out = 0  # reads that took too long (408)
        self.idle_closed = 0  # keep-alive or silent connections closed by the idle timeouts
        self.shed = 0  # closed because the descriptor limit was lowered under them

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[ClientConnection]:
        return iter(list(self._open))

    # -- front.Registry ---------------------------------------------------------------------
    def admit(self, conn: ClientConnection) -> None:
        self._open.add(conn)
        mine = self._by_peer.get(conn.peer)
        if mine is None:
            mine = self._by_peer[conn.peer] = set()
        mine.add(conn)
        if len(mine) > self.limits.per_client:
            pool: Iterable[ClientConnection] = mine
        elif len(self._open) > self.limits.max_connections:
            pool = self._open
        else:
            return
        victim = _idlest(pool, conn)
        if victim is None:
            self.refused += 1
            linger = len(self._lingering) < LINGERING
            if linger:
                self.forget(conn)
                self._lingering.add(conn)
            conn.refuse_connection(_FULL, linger)
        else:
            self.evicted += 1
            victim.evict()

    def forget(self, conn: ClientConnection) -> None:
        self._open.discard(conn)
        self._lingering.discard(conn)
        mine = self._by_peer.get(conn.peer)
        if mine is not None:
            mine.discard(conn)
            if not mine:
                del self._by_peer[conn.peer]

    # -- timeouts ---------------------------------------------------------------------------
    def sweep(self, now: float) -> None:
        for conn in list(self._lingering):
            if now >= conn.linger_until:
                conn.evict()
                self._lingering.discard(conn)
        lim = self.limits
        for conn in list(self._open):
            if conn.closed:
                continue
            if conn.linger_until:
                if now >= conn.linger_until:
                    conn.evict()
                continue
            since = conn.reading_since
            if since:
                late = _late_read(conn, since, now, lim.header_timeout_s, lim.body_timeout_s)
                if late:
                    self.timed_out += 1
                    conn.expire(408, late)
            elif not conn.busy:
                limit = lim.idle_timeout_s if conn.served else lim.header_timeout_s
                if now - conn.idle_since > limit:
                    self.idle_closed += 1
                    conn.expire(0, "")

    def watch_limit(self) -> None:
        """Follow a descriptor limit changed at run time: a lower one lowers the cap and
        closes client connections down to it (lingering refusals, then the idlest, then the
        newest busy ones), so the lease and the legs keep their reserve."""
        cap = self._watch.changed() if self._watch is not None else None
        if cap is None or cap == self.limits.max_connections:
            return
        _log.warning("RLIMIT_NOFILE is now %d: client connections capped at %d (was %d)",
                     self._watch.nofile if self._watch else 0, cap, self.limits.max_connections)
        self.limits = dataclasses.replace(self.limits, max_connections=cap)
        for conn in list(self._lingering):
            conn.evict()
            self._lingering.discard(conn)
        live = [c for c in self._open if not c.closed]
        excess = len(live) - cap
        if excess <= 0:
            return
        idle = sorted((c for c in live if not c.busy), key=lambda c: c.reading_since or c.idle_since)
        busy = sorted((c for c in live if c.busy), key=lambda c: c.idle_since, reverse=True)
        for conn in (idle + busy)[:excess]:
            self.shed += 1
            conn.evict()

    async def run(self) -> None:
        lim = self.limits
        period = max(0.05, min(1.0, lim.header_timeout_s / 4, lim.idle_timeout_s / 4))
        tick = min(period, _WATCH_PERIOD_S)
        swept = time.monotonic()
        while True:
            await asyncio.sleep(tick)
            self.watch_limit()
            now = time.monotonic()
            if now - swept >= period - 1e-3:
                swept = now
                self.sweep(now)

    def state(self) -> dict[str, int]:
        return {"open": len(self._open), "peers": len(self._by_peer),
                "max_connections": self.limits.max_connections,
                "per_client": self.limits.per_client, "evicted": self.evicted,
                "refused": self.refused, "timed_out": self.timed_out,
                "idle_closed": self.idle_closed, "shed": self.shed}


def _late_read(conn: ClientConnection, since: float, now: float, head_s: float,
               body_s: float) -> str:
    """The 408's words when the request being read is late, else '': a head is due
    `head_s` after its first byte, a body `body_s` after its head ended."""
    if conn.parser_in_head:
        if now - since > head_s:
            return f"the request head did not arrive within {head_s:g} s (serving.header_timeout_s)"
        return ""
    if now - (conn.body_since or since) > body_s:
        return (f"the request body did not arrive within {body_s:g} s of its head "
                "(serving.body_timeout_s)")
    return ""


def _idlest(pool: Iterable[ClientConnection], newcomer: ClientConnection) -> ClientConnection | None:
    """The connection not answering a request that has made no progress for longest."""
    best: ClientConnection | None = None
    best_at = 0.0
    for conn in pool:
        if conn is newcomer or conn.busy or conn.closed:
            continue
        if conn.linger_until:
            return conn  # already answered and refused: only waiting to be closed
        at = conn.reading_since or conn.idle_since
        if best is None or at < best_at:
            best, best_at = conn, at
    return best
