"""The SLO-relative pricing math the curve scheduler will place by."""

from __future__ import annotations

import pytest

from narwhal.core.profiles import DecodeCurve, PrefillCurve
from narwhal.serve.router.scheduling.pricing import (
    TPOT_SPREAD_Z,
    DecodeSeat,
    PrefillSeat,
    arrivals_per_step,
    batch_ttft_s,
    best_decode,
    best_prefill,
    decode_impact_s,
    decode_load,
    predicted_tpot_s,
    predicted_ttft_s,
    prefill_load,
    retry_after_s,
    tpot_spread_s,
    ttft_error_seen,
    ttft_margin_s,
)

FIT = {"fit_error": 0.02, "loo_error": 0.03, "samples": 12}


def prefill(a: float, b: float, c: float) -> PrefillCurve:
    return PrefillCurve(a_s=a, b_s_per_token=b, c_s_per_token2=c, max_prompt_tokens=8192, **FIT)


def decode(base: float, per_token: float, per_request: float) -> DecodeCurve:
    return DecodeCurve(base_s=base, per_token_s=per_token, per_request_s=per_request,
                       max_requests=256, max_resident_tokens=1_000_000, **FIT)


def test_ttft_is_queue_plus_the_quadratic_curve() -> None:
    seat = PrefillSeat("p0", prefill(0.01, 1e-4, 1e-8), queued_s=0.5)
    assert predicted_ttft_s(seat, 1000) == pytest.approx(0.5 + 0.01 + 0.1 + 0.01)
    assert prefill_load(0.5, 2.0) == 0.25


def test_the_prefill_engine_with_the_lowest_predicted_ttft_wins_even_if_its_curve_is_slower() -> None:
    fast_busy = PrefillSeat("fast", prefill(0.0, 1e-4, 0.0), queued_s=1.0)
    slow_idle = PrefillSeat("slow", prefill(0.0, 3e-4, 0.0), queued_s=0.0)
    chosen = best_prefill([fast_busy, slow_idle], 1000, ttft_budget_s=2.0)
    assert chosen is not None and chosen.key == "slow"
    assert chosen.predicted_s == pytest.approx(0.3) and chosen.meets_budget
    long_prompt = best_prefill([fast_busy, slow_idle], 20_000, ttft_budget_s=2.0)
    assert long_prompt is not None and long_prompt.key == "fast"  # 3.0 s vs 6.0 s
    assert not long_prompt.meets_budget


def test_no_candidates_means_no_placement() -> None:
    assert best_prefill([], 10, 1.0) is None
    assert best_decode([], 10, 1.0) is None


def test_decode_load_and_impact_follow_the_linear_step() -> None:
    seat = DecodeSeat("d0", decode(0.01, 1e-6, 1e-3), resident_tokens=10_000, running=10)
    assert decode_load(seat, 0.1) == pytest.approx((0.01 + 0.01 + 0.01) / 0.1)
    assert decode_impact_s(seat, 2_000) == pytest.approx(2_000 * 1e-6 + 1e-3)


def test_decode_prefers_the_least_impact_among_engines_that_keep_the_tpot_budget() -> None:
    crowded = DecodeSeat("crowded", decode(0.01, 1e-6, 1e-3), resident_tokens=80_000, running=40)
    light = DecodeSeat("light", decode(0.02, 2e-6, 2e-3), resident_tokens=1_000, running=1)
    chosen = best_decode([crowded, light], 1_000, tpot_budget_s=0.1)
    # crowded after: 0.01+0.081+0.041 = 0.132 > budget; light after: 0.02+0.004+0.004 = 0.028
    assert chosen is not None and chosen.key == "light" and chosen.meets_budget
    both_ok = best_decode([DecodeSeat("a", decode(0.01, 1e-6, 0.0), 0, 0),
                           DecodeSeat("b", decode(0.01, 5e-7, 0.0), 50_000, 5)], 1_000, 0.1)
    assert both_ok is not None and both_ok.key == "b"  # adds 0.0005 s per step, not 0.001


def test_when_no_decode_engine_keeps_the_budget_the_fastest_step_wins_and_says_so() -> None:
    a = DecodeSeat("a", decode(0.2, 0.0, 0.0), 0, 0)
    b = DecodeSeat("b", decode(0.15, 0.0, 0.0), 0, 0)
    chosen = best_decode([a, b], 100, tpot_budget_s=0.1)
    assert chosen is not None and chosen.key == "b" and not chosen.meets_budget


@pytest.mark.parametrize(("ttft", "budget", "after"), [(2.5, 2.0, 1), (0.1, 2.0, 1),
                                                       (7.2, 2.0, 6), (4.0, 2.0, 2)])
def test_retry_after_is_the_whole_seconds_until_the_budget_can_be_met(
        ttft: float, budget: float, after: int) -> None:
    assert retry_after_s(ttft, budget) == after


def test_a_newcomer_is_priced_by_the_worst_ttft_in_the_batch_it_joins() -> None:
    waited = PrefillSeat("p0", prefill(0.1, 0.0, 0.0), queued_s=0.2, waited_s=0.15)
    fresh = PrefillSeat("p1", prefill(0.1, 0.0, 0.0), queued_s=0.3)
    assert predicted_ttft_s(waited, 10) == pytest.approx(0.3)  # its own
    assert batch_ttft_s(waited, 10) == pytest.approx(0.45)  # the oldest waiter's
    chosen = best_prefill([waited, fresh], 10, ttft_budget_s=0.42)
    # p1 answers the newcomer later (0.4 s) but delays nobody already waiting
    assert chosen is not None and chosen.key == "p1" and chosen.meets_budget


def test_decode_arrivals_cost_their_engine_a_prefill_constant_per_step() -> None:
    seat = DecodeSeat("d0", decode(0.01, 0.0, 1e-3), resident_tokens=0, running=10,
                      arrivals=0.5, arrival_s=0.004)
    assert predicted_tpot_s(seat) == pytest.approx(0.01 + 0.01 + 0.002)
    assert arrivals_per_step(20) == 0.05 and arrivals_per_step(None) == 0.0
    assert decode_impact_s(seat, 0, arrivals_per_step(20)) == pytest.approx(1e-3 + 0.0002)
    chosen = best_decode([seat], 0, tpot_budget_s=0.0232, arrivals=arrivals_per_step(20))
    assert chosen is not None and chosen.predicted_s == pytest.approx(0.0232)
    assert chosen.meets_budget
    over = best_decode([seat], 0, tpot_budget_s=0.0232, arrivals=arrivals_per_step(10))
    assert over is not None and not over.meets_budget  # 0.0234 with a shorter stream


def test_a_streams_own_tpot_spread_is_held_to_the_budget_with_its_mean() -> None:
    """Arrivals land at random in a stream's life: its TPOT spreads around the mean step by
    arrival_s * sqrt(arrivals per step / its steps), and admission allows for one spread."""
    assert tpot_spread_s(0.005, 0.44, 48) == pytest.approx(0.005 * (0.44 / 48) ** 0.5)
    assert tpot_spread_s(0.005, 0.44, None) == 0.0 and tpot_spread_s(0.005, 0.0, 48) == 0.0
    assert tpot_spread_s(0.005, 0.44, 12) > tpot_spread_s(0.005, 0.44, 48)  # short: wider
    seat = DecodeSeat("d0", decode(0.01, 0.0, 7e-4), resident_tokens=0, running=20,
                      arrivals=20 / 48, arrival_s=0.005)
    mean = predicted_tpot_s(seat, 0, 1, 1 / 48)
    assert mean < 0.0271  # the mean step alone fits a 27.1 ms budget ...
    unknown = best_decode([seat], 0, 0.0271, 1 / 48)
    assert unknown is not None and unknown.meets_budget  # (a length not given: the mean)
    chosen = best_decode([seat], 0, 0.0271, 1 / 48, steps=48)
    assert chosen is not None and not chosen.meets_budget  # ... not with one spread
    assert chosen.predicted_s == pytest.approx(mean)
    assert TPOT_SPREAD_Z * tpot_spread_s(0.005, 21 / 48, 48) > 0.0271 - mean


def test_the_ttft_margin_follows_the_measured_error_within_its_bounds() -> None:
    mean, dev = 0.0, 0.0
    for error in (0.02, -0.02) * 50:  # right on average, 20 ms either way
        mean, dev = ttft_error_seen(mean, dev, error)
    assert abs(mean) < 0.005 and 0.015 < dev < 0.03
    assert ttft_margin_s(mean, dev, 0.3) == pytest.approx(mean + 0.5 * dev)
    assert ttft_margin_s(1.0, 0.5, 0.3) == pytest.approx(0.15)  # half the budget at most
    assert ttft_margin_s(-1.0, 0.0, 0.3) == pytest.approx(-0.075)  # a quarter back
