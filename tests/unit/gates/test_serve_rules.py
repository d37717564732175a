"""Gate G's router adoption, as data: exactly one controller serves; a router already serving
this fleet is adopted, never a second started beside it; a standby only when it stands by for
that primary; every other router an earlier attempt started is retired."""

from __future__ import annotations

import pytest

from narwhal.deploy.gates.serve_rules import Adoption, Answer, adoption, strays, url_of

BIND, STANDBY = ("127.0.0.1", 8000), ("127.0.0.1", 8001)
NOTHING = Answer()
PRIMARY_AT_BIND = Answer("primary", 11)
PRIMARY_AT_STANDBY = Answer("primary", 12)
STANDING_BY_BIND = Answer("standby", 12, url_of(BIND))
STANDING_BY_STANDBY = Answer("standby", 11, url_of(STANDBY))

CASES = [
    # (what answers at BIND, at STANDBY or None without one) -> decision
    ("nothing anywhere: start the primary", NOTHING, None,
     Adoption(None, None, False, frozenset())),
    ("the primary answers: adopt it", PRIMARY_AT_BIND, None,
     Adoption(BIND, None, False, frozenset({11}))),
    ("something else answers: start (the gate then names it)", Answer("other", 5), None,
     Adoption(None, None, False, frozenset())),
    ("a standby alone is not a primary", Answer("standby", 7, url_of(STANDBY)), None,
     Adoption(None, None, False, frozenset())),
    ("primary and its standby: adopt both", PRIMARY_AT_BIND, STANDING_BY_BIND,
     Adoption(BIND, STANDBY, True, frozenset({11, 12}))),
    ("primary, nothing at the standby's: start the standby", PRIMARY_AT_BIND, NOTHING,
     Adoption(BIND, STANDBY, False, frozenset({11}))),
    ("a standby of another primary is not adopted", PRIMARY_AT_BIND,
     Answer("standby", 12, "http://10.0.0.9:8000"),
     Adoption(BIND, STANDBY, False, frozenset({11}))),
    ("after a takeover the two swap", STANDING_BY_STANDBY, PRIMARY_AT_STANDBY,
     Adoption(STANDBY, BIND, True, frozenset({11, 12}))),
    ("after a takeover with no standby left: start one at the planned address", NOTHING,
     PRIMARY_AT_STANDBY, Adoption(STANDBY, BIND, False, frozenset({12}))),
    ("nothing at either: the standby goes where planned", NOTHING, NOTHING,
     Adoption(None, STANDBY, False, frozenset())),
    ("a primary that does not say its pid is kept as unknown", Answer("primary"), None,
     Adoption(BIND, None, False, frozenset({None}))),
]


@pytest.mark.parametrize(("at_bind", "at_standby", "decided"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_controller_is_adopted_or_started_as_the_table_says(
        at_bind: Answer, at_standby: Answer | None, decided: Adoption) -> None:
    seen = {BIND: at_bind, **({STANDBY: at_standby} if at_standby else {})}
    assert adoption(BIND, STANDBY if at_standby else None, seen) == decided


@pytest.mark.parametrize(("keep", "ours", "ended"), [
    (frozenset({11}), [11, 20, 21], [20, 21]),  # a hung router, a standby no longer named
    (frozenset(), [20], [20]),  # nothing kept: every earlier router goes
    (frozenset({11, None}), [11, 20], []),  # a kept router without its pid: none is ended
    (frozenset({11, 12}), [11, 12], []),
])
def test_only_routers_the_plan_does_not_keep_are_retired(
        keep: frozenset[int | None], ours: list[int], ended: list[int]) -> None:
    assert strays(keep, ours) == ended
