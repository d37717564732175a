"""The router's file-descriptor budget: client sockets never take what serving itself needs.

Renewing the controller lease opens files, placing a leg may open a connection to an engine,
and a health probe opens one too. When client sockets had used every descriptor, each of those
failed with "Too many open files", the lease lapsed and the router stopped (issue 13). So the
router raises its soft RLIMIT_NOFILE to the hard limit at startup and sizes what clients may
hold from what is left after a fixed reserve: each admitted request may hold one client socket,
one engine socket in use and one kept idle for reuse.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

RESERVED = 64  # lease and lock files, journal, logging, listener, event loop, standby poll
PER_ENGINE = 6  # a health probe, a /tokenize and the idle connections kept at the floor
# Connections refused at the cap, held open a moment so their 503 is read, not reset
# (connections.py): beyond these, a refused connection is closed at once.
LINGERING = 64


@dataclass(frozen=True, slots=True)
class Budget:
    """What this process can afford, and whether it is less than the fleet document asked."""

    nofile: int
    max_connections: int
    max_concurrent: int
    idle_per_engine: int

    def note(self, asked_connections: int, asked_concurrent: int) -> str:
        """A warning line when the budget is below what the document asked, else ''."""
        if self.max_connections >= asked_connections and self.max_concurrent >= asked_concurrent:
            return ""
        return (f"RLIMIT_NOFILE {self.nofile} allows {self.max_connections} client connections "
                f"and {self.max_concurrent} concurrent requests (the fleet document asks "
                f"{asked_connections} and {asked_concurrent}); raise the limit (ulimit -n, "
                "systemd LimitNOFILE) to serve what the document asks")


class TooFewDescriptors(Exception):
    """The descriptor limit leaves no room to serve at all."""


def raise_soft_limit() -> int:
    """Lift the soft descriptor limit to the hard one; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


def _caps(nofile: int, max_connections: int, max_concurrent: int,
          engines: int) -> tuple[int, int, int]:
    """(descriptors left after the reserves, concurrent requests, client connections): a
    quarter of what is left for requests, then two engine sockets each, the rest for clients."""
    available = nofile - RESERVED - LINGERING - PER_ENGINE * engines
    concurrent = min(max_concurrent, max(0, available) // 4)
    return available, concurrent, min(max_connections, available - 2 * concurrent)


def plan(nofile: int, max_connections: int, max_concurrent: int, engines: int) -> Budget:
    """Client connections + 2 x concurrent requests + the reserves fit within `nofile`."""
    reserved = RESERVED + LINGERING + PER_ENGINE * engines
    available, concurrent, connections = _caps(nofile, max_connections, max_concurrent, engines)
    if available < 32:
        raise TooFewDescriptors(
            f"RLIMIT_NOFILE {nofile} leaves {max(available, 0)} descriptors after the "
            f"{reserved} the router reserves for {engines} engines; "
            "raise it (ulimit -n, systemd LimitNOFILE) to at least "
            f"{reserved + 256}")
    idle = min(256, max(4, concurrent // max(1, engines)))
    return Budget(nofile, connections, concurrent, idle)


@dataclass(slots=True)
class LimitWatch:
    """The descriptor limit read again while serving: an operator (or a supervisor) may lower
    RLIMIT_NOFILE of the running process (prlimit), and the sockets held under the old limit
    would then leave the lease no descriptor to renew with. connections.py reads `changed`
    a few times a second and sheds client connections down to the new cap."""

    nofile: int
    asked_connections: int
    max_concurrent: int
    engines: int

    def changed(self) -> int | None:
        """The client-connection cap under the soft limit now in force, when that limit
        differs from the last one read; else None. Never raises: a limit below the reserve
        gives a cap of 0 (every client shed, the lease kept)."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == self.nofile:
            return None
        self.nofile = soft
        if soft == resource.RLIM_INFINITY:
            return self.asked_connections
        connections = _caps(soft, self.asked_connections, self.max_concurrent, self.engines)[2]
        return max(0, connections)
