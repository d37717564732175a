"""Role flips: one engine at a time, only across the hysteresis gap, never below a floor or
inside a cooldown, and an engine leaving the decode pool drains before it takes prefills."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from narwhal.core.errors import InputError
from narwhal.core.fleet import RoleFlips, parse_fleet
from narwhal.serve.router.scheduling.bookings import decode_ended, decode_started, prefill_started
from narwhal.serve.router.scheduling.engines import Engine, Placement
from narwhal.serve.router.scheduling.roles import (
    DECODE,
    DRAINING,
    PREFILL,
    Member,
    RoleController,
    decide,
    initial_prefill,
)
from narwhal.serve.router.scheduling.scheduler import CurvePriced
from tests.unit.serve.test_scheduler import Clock, Facts, engine

POLICY = RoleFlips(high_water=0.8, low_water=0.4, cooldown_s=5.0, min_prefill=1, min_decode=1)


def m(name: str, role: str, *, cooled: bool = True, running: int = 0,
      queue_s: float = 0.0) -> Member:
    return Member(name, role, cooled, running, queue_s)


def test_a_heavy_prefill_pool_takes_the_decode_engine_with_the_shortest_drain() -> None:
    members = [m("a", PREFILL), m("b", DECODE, running=5), m("c", DECODE, running=1)]
    flip = decide(members, prefill_load=1.2, decode_load=0.1, policy=POLICY)
    assert flip is not None and (flip.engine_id, flip.from_role, flip.to_role) == \
        ("c", DECODE, PREFILL)
    assert "prefill load 1.20" in flip.why and "high water 0.8" in flip.why


def test_a_heavy_decode_pool_takes_the_prefill_engine_with_the_least_queued() -> None:
    members = [m("a", PREFILL, queue_s=0.3), m("b", PREFILL, queue_s=0.0), m("c", DECODE)]
    flip = decide(members, prefill_load=0.1, decode_load=0.95, policy=POLICY)
    assert flip is not None and (flip.engine_id, flip.to_role) == ("b", DECODE)


@pytest.mark.parametrize(("prefill", "decode"), [
    (0.79, 0.1),   # heavy side not above the high mark
    (1.5, 0.5),    # light side not below the low mark: the gap is the hysteresis
    (1.5, 1.5),    # both pools overloaded: moving an engine only moves the problem
    (0.5, 0.5),
])
def test_no_flip_unless_one_pool_is_above_high_water_and_the_other_below_low_water(
        prefill: float, decode: float) -> None:
    members = [m("a", PREFILL), m("b", PREFILL), m("c", DECODE), m("d", DECODE)]
    assert decide(members, prefill, decode, POLICY) is None


def test_floors_keep_each_pool_at_its_minimum() -> None:
    members = [m("a", PREFILL), m("b", PREFILL), m("c", DECODE)]
    assert decide(members, 2.0, 0.0, POLICY) is None  # c is the last decode engine
    two = RoleFlips(min_prefill=2, min_decode=1)
    assert decide(members, 0.0, 2.0, two) is None  # two prefill engines is the floor
    flip = decide(members, 0.0, 2.0, POLICY)
    assert flip is not None and flip.to_role == DECODE


def test_cooling_engines_are_skipped_and_a_drain_blocks_every_other_flip() -> None:
    members = [m("a", PREFILL), m("b", DECODE, cooled=False), m("c", DECODE, running=9)]
    flip = decide(members, 2.0, 0.0, POLICY)
    assert flip is not None and flip.engine_id == "c"  # b is cooling down
    assert decide([m("a", PREFILL), m("b", DECODE, cooled=False), m("c", DECODE)],
                  2.0, 0.0, RoleFlips(min_decode=1)) is not None
    assert decide([m("a", PREFILL), m("b", DECODE, cooled=False), m("c", DRAINING)],
                  0.0, 2.0, POLICY) is None


@pytest.mark.parametrize(("count", "floors", "first"), [
    (3, (1, 1), 1), (2, (1, 1), 1), (4, (1, 1), 2), (3, (2, 1), 2), (5, (1, 4), 1), (3, (0, 3), 0)])
def test_the_initial_split_is_half_within_the_floors(count: int, floors: tuple[int, int],
                                                      first: int) -> None:
    policy = RoleFlips(min_prefill=floors[0], min_decode=floors[1])
    assert initial_prefill(count, policy) == first


def fleet(clock: Clock) -> tuple[list[Engine], RoleController, CurvePriced]:
    # prefill of 100 tokens costs 0.01 + 0.01 = 0.02 s; a decode step 0.01 s + 10 ms a stream
    engines = [engine(n, "both", a=0.01, b=1e-4, base=0.01, per_token=0.0, per_request=0.01)
               for n in ("b0", "b1", "b2")]
    roles = RoleController(engines, ttft_s=1.0, tpot_s=0.1, policy=POLICY, clock=clock)
    return engines, roles, CurvePriced(engines, 1.0, 0.1, clock=clock)


def test_the_controller_splits_the_pool_and_the_chooser_follows_the_roles() -> None:
    clock = Clock()
    (b0, b1, b2), roles, chooser = fleet(clock)
    assert [roles.role_of(e) for e in (b0, b1, b2)] == [PREFILL, DECODE, DECODE]
    for _ in range(6):
        p = chooser.place(Facts(max_tokens=4))
        assert isinstance(p, Placement) and p.prefill is b0 and p.decode in (b1, b2)
    assert roles.tick() is None  # idle fleet: prefill load 0.01, decode load 0.1


def test_a_prefill_burst_flips_a_decode_engine_after_it_drains_and_cooldown_blocks_flapping(
        ) -> None:
    clock = Clock()
    (b0, b1, b2), roles, _ = fleet(clock)
    decode_started(b1, 50)  # one stream running on b1: b2 has the shorter drain
    prefill_started(b0, 9000, clock.now)  # 0.91 s queued on the only prefill engine
    flip = roles.tick()
    assert flip is not None and (flip.engine_id, flip.to_role) == ("b2", PREFILL)
    assert roles.flips == {(DECODE, PREFILL): 1}
    assert b2.last_flip is not None and b2.last_flip["to"] == PREFILL
    assert b2.state()["current_role"] == PREFILL  # nothing ran there: no drain needed

    # Load reverses at once: the cooldown holds b2 where it is, b0 may still move.
    for _ in range(9):
        decode_started(b1, 50)  # b1's step 0.01 + 10 x 0.01 = 0.11 s > 0.8 x 0.1
    clock.now += 2.0  # b0's queue has drained
    flip = roles.tick()
    assert flip is not None and flip.engine_id == "b0"  # b2 is still cooling
    clock.now += 5.0
    assert roles.tick() is None  # floors: b2 is the last prefill engine now


def test_an_engine_leaving_the_decode_pool_drains_its_streams_first() -> None:
    clock = Clock()
    (b0, b1, b2), roles, chooser = fleet(clock)
    decode_started(b1, 50)
    decode_started(b2, 50)
    prefill_started(b0, 9000, clock.now)
    flip = roles.tick()
    assert flip is not None and flip.engine_id in ("b1", "b2")
    leaving = b1 if flip.engine_id == "b1" else b2
    staying = b2 if leaving is b1 else b1
    assert roles.role_of(leaving) == DRAINING and leaving.state()["current_role"] == "draining"
    for _ in range(4):  # no new decode legs, no prefills either while its stream runs
        p = chooser.place(Facts(max_tokens=4))
        assert isinstance(p, Placement) and p.prefill is b0 and p.decode is staying
    clock.now += 10.0
    assert roles.tick() is None  # still draining: no other flip meanwhile
    assert roles.role_of(leaving) == DRAINING
    decode_ended(leaving, 50)
    roles.tick()
    assert roles.role_of(leaving) == PREFILL and leaving.serves_prefill
    assert not leaving.serves_decode


GOOD: dict[str, Any] = {
    "schema": "narwhal.fleet", "schema_version": 1, "model": "tiny",
    "engines": [{"id": f"b{i}", "url": f"http://10.0.0.{i + 1}:8000", "role": "both"}
                for i in range(3)],
    "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "j.jsonl"},
    "profiles": {"path": "profiles.json"},
    "role_flips": {"interval_s": 0.25, "cooldown_s": 3, "min_prefill": 1, "min_decode": 2},
}


def test_the_role_flips_section_is_optional_and_read_with_defaults() -> None:
    assert parse_fleet({k: v for k, v in GOOD.items() if k != "role_flips"},
                       "f").role_flips is None
    flips = parse_fleet(GOOD, "f").role_flips
    assert flips is not None and (flips.interval_s, flips.cooldown_s, flips.high_water,
                                  flips.low_water) == (0.25, 3.0, 0.8, 0.4)


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"profiles": None}, "role_flips", "profiles section"),
    ({"engines": [{"id": "b0", "url": "http://h:1", "role": "both"},
                  {"id": "d0", "url": "http://h:2", "role": "decode"}]}, "role_flips", "need two"),
    ({"role_flips": {"min_prefill": 2, "min_decode": 2}}, "role_flips.min_prefill", "exceed"),
    ({"role_flips": {"low_water": 0.9, "high_water": 0.9}}, "role_flips.low_water", "flap"),
    ({"role_flips": {"min_prefill": 0}}, "role_flips.min_prefill", "could empty"),
    ({"role_flips": {"cooldown": 3}}, "role_flips.cooldown", "unknown key"),
    ({"role_flips": {"interval_s": 0}}, "role_flips.interval_s", "greater than or equal"),
    ({"role_flips": {"high_water": "high"}}, "role_flips.high_water", "number"),
    ({"role_flips": {"min_decode": -1}}, "role_flips.min_decode", "greater than or equal"),
    ({"role_flips": {"mode": "predictive"}}, "role_flips.mode", "reactive"),
    ({"role_flips": {"mode": "planner", "window_s": 0.4}}, "role_flips.window_s", "two intervals"),
    ({"role_flips": {"prefill_utilization": 1.5}}, "role_flips.prefill_utilization", "less than"),
    ({"role_flips": {"decode_utilization": 0}}, "role_flips.decode_utilization", "greater than"),
])
def test_a_bad_role_flips_section_is_refused_naming_the_field(changes: dict[str, Any],
                                                              field: str, words: str) -> None:
    doc = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    with pytest.raises(InputError) as info:
        parse_fleet(doc, "fleet.json")
    lines = [f"{p.field}: {p.problem}; {p.fix}" for p in info.value.problems]
    assert any(line.startswith(field) and words in line for line in lines), lines
