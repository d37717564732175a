"""Every open client connection: the cap on them, each peer's share, and the read timeouts.

A router that runs out of file descriptors cannot renew its controller lease, open a leg to an
engine or write its journal, so client connections never take every descriptor: their cap
comes from the descriptor budget (descriptors.py). At the cap, or when one peer address holds
more than its share, a new connection does not wait and is not refused while an idle one
exists: the idlest connection (of that peer first, else of all) is closed to make room, so
sockets held open and silent cost their holder its oldest sockets, not other clients their
service. Only when every connection is busy answering is the newcomer refused with a 503.

A sweep every quarter of the shortest timeout closes what holds a slot without progress: a
head not complete within `header_timeout_s` (slowloris) or a body within `body_timeout_s`
(408), a connection that sent nothing within `header_timeout_s`, and a keep-alive connection
idle for `idle_timeout_s`. Nothing here runs per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator

from narwhal.serve.router.front.front import ClientConnection
from narwhal.serve.router.settings import ClientLimits

_FULL = ("the router is at its connection limit and every connection is answering a request "
         "(serving.max_connections); retry shortly")


class Connections:
    """The open client connections of one router (front.Registry)."""

    def __init__(self, limits: ClientLimits) -> None:
        self.limits = limits
        self._open: set[ClientConnection] = set()
        self._by_peer: dict[str, set[ClientConnection]] = {}
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # new connections refused because every slot was busy
        self.timed_out = 0  # reads that took too long (408)
        self.idle_closed = 0  # keep-alive or silent connections closed by the idle timeouts

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
            conn.refuse_connection(_FULL)
        else:
            self.evicted += 1
            victim.evict()

    def forget(self, conn: ClientConnection) -> None:
        self._open.discard(conn)
        mine = self._by_peer.get(conn.peer)
        if mine is not None:
            mine.discard(conn)
            if not mine:
                del self._by_peer[conn.peer]

    # -- timeouts ---------------------------------------------------------------------------
    def sweep(self, now: float) -> None:
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
                limit = lim.header_timeout_s if conn.parser_in_head else \
                    lim.header_timeout_s + lim.body_timeout_s
                if now - since > limit:
                    self.timed_out += 1
                    what = "head" if conn.parser_in_head else "body"
                    conn.expire(408, f"the request {what} did not arrive within "
                                f"{limit:g} s (serving.header_timeout_s"
                                f"{'' if conn.parser_in_head else ' + body_timeout_s'})")
            elif not conn.busy:
                limit = lim.idle_timeout_s if conn.served else lim.header_timeout_s
                if now - conn.idle_since > limit:
                    self.idle_closed += 1
                    conn.expire(0, "")

    async def run(self) -> None:
        lim = self.limits
        period = max(0.05, min(1.0, lim.header_timeout_s / 4, lim.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            self.sweep(time.monotonic())

    def state(self) -> dict[str, int]:
        return {"open": len(self._open), "peers": len(self._by_peer),
                "max_connections": self.limits.max_connections,
                "per_client": self.limits.per_client, "evicted": self.evicted,
                "refused": self.refused, "timed_out": self.timed_out,
                "idle_closed": self.idle_closed}


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
