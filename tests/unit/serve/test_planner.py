"""The pool planner sizes prefill and decode pools from a window of demand, and the controller
in planner mode moves one engine per tick towards that split (drain, cooldown and floors kept)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from narwhal.core.fleet import RoleFlips
from narwhal.core.profiles import DecodeCurve
from narwhal.serve.router.scheduling.bookings import decode_ended, decode_started
from narwhal.serve.router.scheduling.engines import Refusal
from narwhal.serve.router.scheduling.planner import (
    Demand,
    DemandWindow,
    PoolShape,
    Refused,
    Sample,
    Sizing,
    StepCost,
    candidates,
    decode_loss,
    plan_prefill,
    prefill_loss,
)
from narwhal.serve.router.scheduling.roles import DECODE, DRAINING, PREFILL, RoleController, decide
from narwhal.serve.router.scheduling.scheduler import CurvePriced
from tests.unit.serve.test_roles import m
from tests.unit.serve.test_scheduler import Clock, Facts, engine

# The goodput bench's curve: a decode step is 10 ms + 0.4 ms a stream; TPOT budget 25 ms.
CURVE = DecodeCurve(base_s=0.01, per_token_s=1e-7, per_request_s=4e-4, max_requests=64,
                    max_resident_tokens=200_000, fit_error=0.01, loo_error=0.01, samples=12)
FOUR = PoolShape(movable=4, fixed_prefill=0, fixed_decode=0, min_prefill=1, min_decode=1)


def plan(demand: Demand, shape: PoolShape = FOUR) -> int:
    return plan_prefill(demand, shape, Sizing(CURVE, 0.3, 0.025, prefill_utilization=0.7,
                                              decode_utilization=0.8))


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


# The goodput bench's engines: 0.7 ms a stream, 5 ms to land a leg (the prefill constant),
# and a decode engine that learned its curve runs 1.5 ms fast; SLO 0.3 s TTFT, 25 ms TPOT.
BENCH = DecodeCurve(base_s=0.01, per_token_s=1e-7, per_request_s=7e-4, max_requests=64,
                    max_resident_tokens=200_000, fit_error=0.01, loo_error=0.01, samples=12)
LANDING = StepCost(arrival_s=0.00503, bias_s=-0.0015)


def bench_sizing(decoding_now: int) -> Sizing:
    return Sizing(BENCH, 0.3, 0.025, prefill_utilization=0.7, decode_utilization=0.8,
                  cost=LANDING, decoding_now=decoding_now)


# The prefill-heavy phase as the planner saw it at 3 prefill + 1 decode: 44 requests a second,
# 1200-token prompts (48 ms of prefill each), 8.7 streams of 8 tokens on the decode engine.
PREFILL_HEAVY = Demand(prefill_rate=2.12, streams=8.7, resident_tokens=8.7 * 1200,
                       arrivals=8.7 / 8, requests=44.0)


def test_a_prefill_pool_refuses_little_below_saturation_and_the_overload_above_it() -> None:
    at = [prefill_loss(PREFILL_HEAVY, n, 0.3) for n in (1, 2, 3, 4)]
    assert at == sorted(at, reverse=True)
    assert at[0] > 0.5  # 2.1 engines of work on one
    assert 0.05 < at[1] < 0.2  # 6% over capacity: the bench refused 11% at two engines
    assert at[2] < 0.01
    # A tighter budget holds fewer prefills in the queue: the same load refuses more.
    assert prefill_loss(PREFILL_HEAVY, 2, 0.15) > at[1]
    # Without a request rate only the overload itself counts.
    assert prefill_loss(Demand(2.12, 0, 0), 2, 0.3) == pytest.approx(1 - 2 / 2.12)


def test_a_decode_engine_of_short_streams_refuses_what_its_landing_legs_leave_no_room_for() -> None:
    one = decode_loss(PREFILL_HEAVY, 1, BENCH, 0.025, LANDING, decoding_now=1)
    assert one > 0.15  # the bench refused 17% on TPOT with one decode engine
    assert decode_loss(PREFILL_HEAVY, 2, BENCH, 0.025, LANDING, decoding_now=1) < 0.01
    # Priced on the curve alone the same engine would look nearly free of refusals.
    assert decode_loss(PREFILL_HEAVY, 1, BENCH, 0.025, decoding_now=1) < one / 2


def test_the_split_is_the_one_that_refuses_least_not_the_one_that_evens_the_loads() -> None:
    splits = {s.prefill: s for s in candidates(PREFILL_HEAVY, FOUR, bench_sizing(1))}
    # Evening the loads against the utilisation targets would give prefill three engines ...
    assert max(splits[3].prefill_load, splits[3].decode_load) < max(splits[2].prefill_load,
                                                                     splits[2].decode_load)
    # ... but that split refuses more, so two engines prefill and two decode.
    assert splits[2].loss < splits[3].loss - 0.05
    assert plan_prefill(PREFILL_HEAVY, FOUR, bench_sizing(1)) == 2
    # Once there, the window's streams spread over two engines: the plan stays.
    there = Demand(2.12, 4.6, 4.6 * 1200, 4.6 / 8, 39.0)
    assert plan_prefill(there, FOUR, bench_sizing(2)) == 2


def test_near_a_tie_the_current_split_stays() -> None:
    # Both splits refuse about 9% (the estimates swing with the window): at two and two the
    # planner does not move, though three prefill engines would even the loads better ...
    seen = Demand(2.063, 4.1, 4938, 0.511, 42.8)
    sizing = Sizing(BENCH, 0.3, 0.025, 0.7, 0.8, StepCost(0.00503, -0.0028), decoding_now=2)
    assert plan_prefill(seen, FOUR, sizing, current=2) == 2
    assert plan_prefill(seen, FOUR, sizing) == 3
    # ... and at three and one, where the decode engine refuses 27%, it moves back.
    seen = Demand(2.108, 8.4, 10252, 1.032, 42.8)
    sizing = Sizing(BENCH, 0.3, 0.025, 0.7, 0.8, StepCost(0.00503, -0.0014), decoding_now=1)
    assert plan_prefill(seen, FOUR, sizing, current=3) == 2


def test_with_room_to_spare_a_split_within_its_targets_stays() -> None:
    # The mixed phase: one prefill engine or two both serve it; the planner once moved an
    # engine back and forth between them every two seconds.
    mixed = Demand(0.589, 18.4, 3676, 0.587, 32.4)
    assert plan_prefill(mixed, FOUR, bench_sizing(3), current=1) == 1
    assert plan_prefill(mixed, FOUR, bench_sizing(2), current=2) == 2
    # A current split over its targets is left for the best-balanced one.
    assert plan_prefill(Demand(0.755, 13.1, 3802, 0.541, 30.0), FOUR, bench_sizing(3),
                        current=1) == 2


def test_the_decode_pool_is_sized_for_what_the_prefill_pool_admits() -> None:
    # Clients that retry a 429 at once offer the same prompts again and again: 20 s of prefill
    # a second and, counted as demand, their decode work too (one 1-token stream each). Were
    # the decode pool sized for all of it, one decode engine would refuse everything and the
    # planner would keep two; two prefill engines turn most of it away first.
    curve = DecodeCurve(base_s=0.005, per_token_s=0.0, per_request_s=0.008, max_requests=64,
                        max_resident_tokens=65536, fit_error=0.01, loo_error=0.01, samples=12)
    sizing = Sizing(curve, 1.0, 0.05, 0.7, 0.8, StepCost(0.01022, 0.0), decoding_now=2)
    storm = Demand(20.37, 1.53, 2442, 1.525, 56.2)
    three = PoolShape(3, 0, 0, 1, 1)
    assert plan_prefill(storm, three, sizing, current=1) == 2
    full = decode_loss(storm, 1, curve, 0.05, sizing.cost, decoding_now=2)
    split = {s.prefill: s for s in candidates(storm, three, sizing)}
    assert full == 1.0 and split[2].loss < split[1].loss


@pytest.mark.parametrize(("demand", "decoding_now", "prefill"), [
    # decode-heavy: 38 requests a second of 80-token prompts and 48-token answers
    (Demand(0.285, 36, 36 * 104, 36 / 48, 38.0), 3, 1),
    # mixed: half of each; one prefill engine would refuse 1.5% of the prompts
    (Demand(0.83, 10, 10 * 261, 0.375, 30.0), 3, 2),
])
def test_the_bench_phases_get_the_split_that_serves_them(demand: Demand, decoding_now: int,
                                                         prefill: int) -> None:
    assert plan_prefill(demand, FOUR, bench_sizing(decoding_now)) == prefill


def test_streams_that_would_outgrow_any_step_are_all_refused() -> None:
    heavy = Demand(0.285, 36, 36 * 104, 36 / 48, 38.0)
    assert decode_loss(heavy, 1, BENCH, 0.025, LANDING, decoding_now=3) == 1.0


@given(prefill_rate=st.floats(0, 50), streams=st.floats(0, 500), tokens=st.floats(0, 1e6),
       arrivals=st.floats(0, 50), requests=st.floats(0, 5000), bias=st.floats(-0.0125, 0.025),
       base=st.floats(0, 0.02), decoding_now=st.integers(0, 4), current=st.integers(0, 4))
def test_any_demand_gives_a_split_within_the_floors_and_losses_that_are_shares(
        prefill_rate: float, streams: float, tokens: float, arrivals: float, requests: float,
        bias: float, base: float, decoding_now: int, current: int) -> None:
    curve = DecodeCurve(base_s=base, per_token_s=1e-7, per_request_s=7e-4, max_requests=64,
                        max_resident_tokens=200_000, fit_error=0.01, loo_error=0.01, samples=12)
    demand = Demand(prefill_rate, streams, tokens, arrivals, requests)
    sizing = Sizing(curve, 0.3, 0.05, 0.7, 0.8, StepCost(0.005, bias), decoding_now)
    for split in candidates(demand, FOUR, sizing):
        assert 0.0 <= split.loss <= 1.0
    assert 1 <= plan_prefill(demand, FOUR, sizing, current) <= 3


def test_the_window_reports_offered_rate_and_mean_streams_only_once_half_full() -> None:
    window = DemandWindow(4.0)
    window.add(Sample(0.0, 10.0, 2, 100, offered_requests=100))
    window.add(Sample(1.0, 11.0, 4, 300, offered_requests=120))
    assert window.demand() is None  # 1 s of a 4 s window
    window.add(Sample(2.0, 12.5, 6, 500, offered_requests=150))
    d = window.demand()
    assert d is not None and math.isclose(d.prefill_rate, 1.25) and d.streams == 4.0
    assert d.requests == 25.0
    window.add(Sample(7.0, 20.0, 0, 0))  # everything older than 4 s leaves the window
    assert window.demand() is None


def test_decode_work_refused_on_tpot_still_counts_as_decode_demand() -> None:
    window = DemandWindow(4.0)
    window.add(Sample(0.0, 0.0, 10, 1000, arrivals=0.5))
    # 3 stream-seconds refused per second, and 0.25 landing legs per step
    window.add(Sample(2.0, 0.0, 10, 1000, arrivals=0.5, refused=Refused(6.0, 900.0, 0.5)))
    d = window.demand()
    assert d is not None and d.streams == 13.0 and d.resident_tokens == 1450.0
    assert d.arrivals == 0.75


def test_streams_refused_on_tpot_reach_the_planner() -> None:
    clock = Clock()
    engines = [engine(f"b{i}", "both", a=0.01, b=1e-4, base=0.01, per_token=0.0,
                      per_request=0.004) for i in range(4)]
    chooser = CurvePriced(engines, ttft_s=1.0, tpot_s=0.05, clock=clock)
    policy = RoleFlips(mode="planner", window_s=2.0, interval_s=0.5, cooldown_s=1.0)
    roles = RoleController(engines, 1.0, 0.05, policy, clock=clock,
                           offered_prefill_s=lambda: chooser.offered_prefill_s,
                           refused_decode=lambda: Refused(chooser.refused_decode_stream_s,
                                                          chooser.refused_decode_token_s),
                           offered_requests=lambda: chooser.admitted + chooser.refused_tpot)
    for _ in range(6):
        for _ in range(40):  # the two decode engines fill to the budget, the rest is refused
            placed = chooser.place(Facts(price_tokens=10, max_tokens=50))
            if not isinstance(placed, Refusal):
                assert placed is not None
                decode_started(placed.decode, 35, 0.0)
        clock.now += 0.5
        roles.tick()
    admitted_streams = sum(e.load.running for e in engines)
    assert chooser.refused_tpot > 0
    demand = roles.state()["demand"]
    assert demand["streams"] > admitted_streams + 10  # refused streams are demand too
    assert demand["requests_per_s"] == pytest.approx(80.0, rel=0.01)  # 40 offered each 0.5 s


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
            e.load.busy_until, e.load.prefill_pending, e.load.running, e.load.resident_tokens = clock.now, 0, 0, 0
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
        if roles.role_of(e) == DECODE and e.load.running == 0:
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
