"""Leg deadlines derived from what a leg carries (serve/router/request/deadlines.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from narwhal.serve.router.request.deadlines import handoff_deadline_s, leg_deadline_s

seconds = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)


def test_a_prefill_gets_factor_times_its_prediction_between_the_floor_and_the_cap() -> None:
    assert leg_deadline_s(0.5, 4.0, 5.0, 60.0) == 5.0  # a short prefill: the floor
    assert leg_deadline_s(3.0, 4.0, 5.0, 60.0) == 12.0
    assert leg_deadline_s(30.0, 4.0, 5.0, 60.0) == 60.0  # never past the fixed cap


def test_a_leg_nothing_predicted_waits_the_fixed_cap() -> None:
    assert leg_deadline_s(0.0, 4.0, 5.0, 60.0) == 60.0
    assert handoff_deadline_s(0.0, 2.0, 60.0) == 60.0


def test_a_handoff_gets_its_budget_and_then_the_stall_allowance() -> None:
    assert handoff_deadline_s(1.0, 2.0, 60.0) == 3.0
    assert handoff_deadline_s(100.0, 2.0, 60.0) == 60.0


@given(seconds, st.floats(min_value=1.0, max_value=100.0), seconds, seconds)
def test_a_derived_deadline_is_never_past_the_cap_nor_under_the_floor_below_it(
        predicted: float, factor: float, floor: float, cap: float) -> None:
    got = leg_deadline_s(predicted, factor, floor, cap)
    assert got <= cap
    if predicted > 0.0:
        assert got >= min(floor, cap)
        assert got >= min(factor * predicted, cap)
