"""The pool planner sizes prefill and decode pools from a window of demand, and the controller
in planner mode moves one engine per tick towards that split (drain, cooldown and floors kept)."""

from __future__ import annotations

import math

import pytest

from narwhal.core.fleet import RoleFlips
from narwhal.core.profiles import DecodeCurve
from narwhal.serve.engines import Refusal
from narwhal.serve.planner import Demand, DemandWindow, PoolShape, plan_prefill
from narwhal.serve.roles import DECODE, DRAINING, PREFILL, RoleController, decide
from narwhal.serve.scheduler import CurvePriced, decode_ended, decode_started
from tests.unit.serve.test_roles import m
from tests.unit.serve.test_scheduler import Clock, Facts, engine

# The goodput bench's curve: a decode step is 10 ms + 0.4 ms a stream; TPOT budget 25 ms.
CURVE = DecodeCurve(base_s=0.01, per_token_s=1e-7, per_request_s=4e-4, max_requests=64,
                    max_resident_tokens=200_000, fit_error=0.01, loo_error=0.01, samples=12)
FOUR = PoolShape(movable=4, fixed_prefill=0, fixed_decode=0, min_prefill=1, min_decode=1)


def plan(demand: Demand, shape: PoolShape = FOUR) -> int:
    return plan_prefill(demand, shape, CURVE, 0.025, prefill_utilization=0.7,
                        decode_utilization=0.8)


@pytest.mark.parametrize(("demand", "prefill"), [
    (Demand(prefill_rate=1.8, streams=4, resident_tokens=5000), 3),    # long prompts, short answers
    (Demand(prefill_rate=0.3, streams=60, resident_tokens=9000), 1),   # short prompts, long answers
    (Demand(prefill_rate=0.9, streams=25, resident_tokens=20000), 2),  # a mix
    (Demand(prefill_rate=0.0, streams=0, resident_tokens=0), 1),       # idle: spare goes to decode
])
def test_the_split_follows_the_mix(demand: Demand, prefill: int) -> None:
    assert plan(demand) == prefill


def test_floors_and_fixed_engines_bound_the_split() -> None:
    heavy = Demand(prefill_rate=5.0, streams=0, resident_tokens=0)
    assert plan(heavy) == 3  # min_decode keeps one decode engine
    assert plan(heavy, PoolShape(4, 0, 0, 1, 2)) == 2
    # Two fixed prefill engines already carry 1.4 s/s at 0.7: the movable ones decode.
    assert plan(Demand(1.2, 30, 6000), PoolShape(2, 2, 0, 0, 1)) == 0


def test_the_window_reports_offered_rate_and_mean_streams_only_once_half_full() -> None:
    window = DemandWindow(4.0)
    window.add(0.0, 10.0, 2, 100)
    window.add(1.0, 11.0, 4, 300)
    assert window.demand() is None  # 1 s of a 4 s window
    window.add(2.0, 12.5, 6, 500)
    d = window.demand()
    assert d is not None and math.isclose(d.prefill_rate, 1.25) and d.streams == 4.0
    window.add(7.0, 20.0, 0, 0)  # everything older than 4 s leaves the window
    assert window.demand() is None


def test_decode_work_refused_on_tpot_still_counts_as_decode_demand() -> None:
    window = DemandWindow(4.0)
    window.add(0.0, 0.0, 10, 1000, 0.0, 0.0)
    window.add(2.0, 0.0, 10, 1000, 6.0, 900.0)  # 3 stream-seconds refused per second
    d = window.demand()
    assert d is not None and d.streams == 13.0 and d.resident_tokens == 1450.0


def test_streams_refused_on_tpot_reach_the_planner() -> None:
    clock = Clock()
    engines = [engine(f"b{i}", "both", a=0.01, b=1e-4, base=0.01, per_token=0.0,
                      per_request=0.004) for i in range(4)]
    chooser = CurvePriced(engines, ttft_s=1.0, tpot_s=0.05, clock=clock)
    policy = RoleFlips(mode="planner", window_s=2.0, interval_s=0.5, cooldown_s=1.0)
    roles = RoleController(engines, 1.0, 0.05, policy, clock=clock,
                           offered_prefill_s=lambda: chooser.offered_prefill_s,
                           refused_decode=lambda: (chooser.refused_decode_stream_s,
                                                   chooser.refused_decode_token_s))
    for _ in range(6):
        for _ in range(40):  # the two decode engines fill to the budget, the rest is refused
            placed = chooser.place(Facts(price_tokens=10, max_tokens=50))
            if not isinstance(placed, Refusal):
                assert placed is not None
                decode_started(placed.decode, 35, 0.0)
        clock.now += 0.5
        roles.tick()
    admitted_streams = sum(e.running for e in engines)
    assert chooser.refused_tpot > 0
    demand = roles.state()["demand"]
    assert demand["streams"] > admitted_streams + 10  # refused streams are demand too


def test_a_lighter_pool_gives_up_an_engine_only_if_it_stays_light_without_it() -> None:
    members = [m("a", PREFILL), m("b", DECODE), m("c", DECODE)]
    policy = RoleFlips(high_water=0.8, low_water=0.4)
    assert decide(members, 1.5, 0.2, policy, spare_decode=0.6) is None
    flip = decide(members, 1.5, 0.2, policy, spare_decode=0.35)
    assert flip is not None and flip.to_role == PREFILL


def controller(clock: Clock) -> tuple[list, RoleController, CurvePriced]:  # type: ignore[type-arg]
    engines = [engine(f"b{i}", "both", a=0.01, b=1e-4, base=0.01, per_token=0.0, per_request=0.004)
               for i in range(4)]
    chooser = CurvePriced(engines, ttft_s=1.0, tpot_s=0.05, clock=clock)
    policy = RoleFlips(mode="planner", window_s=2.0, interval_s=0.5, cooldown_s=1.0)
    roles = RoleController(engines, 1.0, 0.05, policy, clock=clock,
                           offered_prefill_s=lambda: chooser.offered_prefill_s)
    return engines, roles, chooser


def test_a_prefill_wave_moves_decode_engines_to_prefill_one_per_tick() -> None:
    clock = Clock()
    engines, roles, chooser = controller(clock)
    assert [roles.role_of(e) for e in engines] == [PREFILL, PREFILL, DECODE, DECODE]
    prefill_roles = []
    for _ in range(12):  # 1000-token prompts at 40/s: 0.11 s each, 4.4 s of prefill a second
        for _ in range(20):
            chooser.place(Facts(price_tokens=1000, max_tokens=4))
        for e in engines:  # the queue drains between ticks; nothing decodes yet
            e.busy_until, e.prefill_pending, e.running, e.resident_tokens = clock.now, 0, 0, 0
        clock.now += 0.5
        roles.tick()
        prefill_roles.append(sum(1 for e in engines if roles.role_of(e) == PREFILL))
    assert roles.target_prefill == 3  # min_decode keeps one decode engine
    assert prefill_roles[-1] == 3 and prefill_roles == sorted(prefill_roles)
    assert roles.state()["demand"]["prefill_s_per_s"] > 4.0


def test_a_decode_wave_moves_prefill_engines_to_decode_and_drains_before_moving_back() -> None:
    clock = Clock()
    engines, roles, _ = controller(clock)
    decoders = [e for e in engines if roles.role_of(e) == DECODE]
    for e in decoders:
        for _ in range(12):  # 12 streams each: 0.01 + 12 x 4 ms = 58 ms > 50 ms budget
            decode_started(e, 100)
    for _ in range(8):
        clock.now += 0.5
        roles.tick()
    assert roles.target_prefill == 1
    assert sum(1 for e in engines if roles.role_of(e) == DECODE) == 3
    # The overload ends, one stream stays on each decode engine, and prefill demand returns.
    for e in decoders:
        for _ in range(11):
            decode_ended(e, 100)
    for e in engines:
        if roles.role_of(e) == DECODE and e.running == 0:
            decode_started(e, 100)
    base = clock.now
    roles._offered = lambda: (clock.now - base) * 3.0  # 3 s of prefill offered per second
    for _ in range(6):
        clock.now += 0.5
        roles.tick()
    leaving = [e for e in engines if roles.role_of(e) == DRAINING]
    assert roles.target_prefill == 3 and len(leaving) == 1  # one at a time, streams finish first
    assert not leaving[0].serves_prefill and not leaving[0].serves_decode
    decode_ended(leaving[0], 100)
    clock.now += 0.5
    roles.tick()
    assert roles.role_of(leaving[0]) == PREFILL
