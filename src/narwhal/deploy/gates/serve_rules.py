"""Gate G's router adoption rule, on plain data: which router already answering is kept.

Exactly one controller per fleet: a primary router of this fleet already answering at a
planned address is adopted, never a second started beside it; a warm standby is adopted only
when it answers as the standby of that primary. Every other narwhal-serve an earlier attempt
started is retired (unless one of the kept routers does not say its pid: then the kept cannot
be told from the others, and none is ended). The gate's execute reads what answers and acts;
this module only decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Address = tuple[str, int]


def url_of(bind: Address) -> str:
    return f"http://{bind[0]}:{bind[1]}"


@dataclass(frozen=True)
class Answer:
    """What answers at one planned address: role "primary" or "standby" (a router of this
    fleet's model), "other" (something else) or "" (nothing); the pid it says it has; and,
    for a standby, the primary URL it stands by for."""

    role: str = ""
    pid: int | None = None
    standby_of: str | None = None


@dataclass(frozen=True)
class Adoption:
    """The decision: the primary to adopt (None: start one at the planned address), where
    the standby belongs (None: the plan has none), whether the one answering there is
    adopted (else one is started), and the pids of the routers kept."""

    primary: Address | None
    standby_at: Address | None
    standing_by: bool
    keep: frozenset[int | None]


def adoption(bind: Address, standby: Address | None,
             seen: Mapping[Address, Answer]) -> Adoption:
    """Adopt the primary answering at either planned address (the planned one first); the
    standby belongs at the other address (after a takeover the primary answers at the
    standby's, and the two swap), and is adopted only when it stands by for that primary."""
    addresses = [bind, *([standby] if standby else [])]
    primary = next((b for b in addresses if seen[b].role == "primary"), None)
    standby_at = None if standby is None else standby if primary in (None, bind) else bind
    standing_by = primary is not None and standby_at is not None and \
        seen[standby_at].role == "standby" and \
        seen[standby_at].standby_of == url_of(primary)
    keep = frozenset(seen[b].pid for b in (primary, standby_at if standing_by else None) if b)
    return Adoption(primary, standby_at, standing_by, keep)


def strays(keep: frozenset[int | None], ours: Iterable[int]) -> list[int]:
    """The pids of our routers that the plan does not keep (a hung router, a standby no
    longer named); none when a kept router does not say its pid (it cannot be told apart)."""
    return [] if None in keep else [pid for pid in ours if pid not in keep]
