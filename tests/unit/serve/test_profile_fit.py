"""The profiler's non-negative least squares and its errors, on synthetic data with known answers."""

from __future__ import annotations

import math

import pytest

from narwhal.serve.profiler.fit import MIN_POINTS, FitRefused, fit_curve, nnls
from narwhal.serve.profiler.plan import EngineLimits, SweepSettings, geometric, plan_for


def _prefill_rows(lengths: list[int]) -> list[list[float]]:
    return [[1.0, float(n), float(n * n)] for n in lengths]


def test_exact_prefill_coefficients_are_recovered_from_noise_free_samples() -> None:
    """A quadratic the emulator follows exactly must come back exactly (to float precision)."""
    a, b, c = 0.02, 1e-4, 5e-8
    lengths = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    rows = _prefill_rows(lengths)
    fit = fit_curve(rows, [a + b * n + c * n * n for n in lengths])
    assert fit.coefficients == pytest.approx((a, b, c), rel=1e-7)
    assert fit.fit_error < 1e-9 and fit.loo_error < 1e-9 and fit.points == len(lengths)


def test_exact_decode_coefficients_are_recovered_from_a_concurrency_by_context_grid() -> None:
    base, per_token, per_request = 0.01, 2e-6, 1e-3
    rows = [[1.0, float(c * ctx), float(c)] for ctx in (64, 1024) for c in (1, 2, 4, 8)]
    fit = fit_curve(rows, [base + per_token * r[1] + per_request * r[2] for r in rows])
    assert fit.coefficients == pytest.approx((base, per_token, per_request), rel=1e-7)


def test_a_coefficient_that_would_fit_negative_is_zero_and_the_others_are_refit() -> None:
    """A concave curve would give a negative n^2 term; the router must never see one."""
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    ys = [1.0 + 2.0 * x - 0.05 * x * x for x in xs]
    rows = [[1.0, x, x * x] for x in xs]
    coef = nnls(rows, ys)
    assert coef[2] == 0.0 and min(coef) >= 0.0
    # With c held at 0 the best fit is the ordinary straight line through the points.
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    assert coef[1] == pytest.approx(slope, rel=1e-9)
    assert coef[0] == pytest.approx(my - slope * mx, rel=1e-9)


def test_all_terms_negative_leaves_the_zero_curve() -> None:
    coef = nnls([[1.0, x] for x in (1.0, 2.0, 3.0)], [-1.0, -2.0, -3.0])
    assert coef == (0.0, 0.0)


def test_leave_one_out_error_is_larger_than_the_fit_error_on_an_outlier() -> None:
    """The LOO error is what the curve is worth on a prompt it has not seen."""
    lengths = [64, 128, 256, 512, 1024]
    ys = [0.01 + 1e-5 * n for n in lengths]
    ys[2] *= 1.3  # one stalled sample
    fit = fit_curve(_prefill_rows(lengths), ys)
    assert 0 < fit.fit_error < fit.loo_error
    # By hand: LOO of point i is the relative miss of a fit of the other four.
    misses = []
    for i in range(len(lengths)):
        rest = [j for j in range(len(lengths)) if j != i]
        sub = fit_curve(_prefill_rows([lengths[j] for j in rest]), [ys[j] for j in rest], min_points=3)
        misses.append((sub.predict(_prefill_rows([lengths[i]])[0]) - ys[i]) / ys[i])
    assert fit.loo_error == pytest.approx(math.sqrt(sum(m * m for m in misses) / len(misses)), rel=1e-6)


def test_too_few_distinct_points_are_refused_with_the_count_and_minimum() -> None:
    rows = _prefill_rows([64, 64, 128, 256])  # four samples, three distinct lengths
    with pytest.raises(FitRefused, match=f"3 distinct point\\(s\\), at least {MIN_POINTS} needed"):
        fit_curve(rows, [0.1, 0.1, 0.2, 0.3])


def test_points_that_cannot_separate_the_terms_are_refused() -> None:
    """One context only: resident tokens are a multiple of running requests, so the two terms
    cannot be told apart and any split would be a guess."""
    rows = [[1.0, float(c * 64), float(c)] for c in (1, 2, 4, 8)]
    with pytest.raises(FitRefused, match="separate"):
        fit_curve(rows, [0.01 + 1e-4 * c for c in (1, 2, 4, 8)])


def test_a_non_positive_time_is_refused() -> None:
    with pytest.raises(FitRefused, match="positive finite"):
        fit_curve(_prefill_rows([1, 2, 3, 4]), [0.1, 0.0, 0.2, 0.3])


def test_default_prompt_lengths_follow_the_engine_limit() -> None:
    """Defaults stay inside what the engine accepts, so the sweep never asks for a refusal."""
    plan, problems = plan_for("e0", SweepSettings(), EngineLimits(max_model_len=512, kv_capacity_tokens=None))
    assert not problems and plan is not None
    assert plan.prefill_lengths[0] == 32 and plan.prefill_lengths[-1] == 511
    assert plan.decode_contexts == (64, 512 - 32)
    big, _ = plan_for("e0", SweepSettings(), EngineLimits(131072, 10_000_000))
    assert big is not None and big.prefill_lengths[-1] == 4096 and big.decode_contexts == (64, 1024)
    assert geometric(32, 4096, 8) == (32, 64, 128, 256, 512, 1024, 2048, 4096)


def test_a_workload_prompt_to_cover_stretches_the_default_sweep_or_is_refused_named() -> None:
    """Gate F passes the workload's prompt length: the curves must measure it, not
    extrapolate to it; a prompt the engine cannot take is refused naming the engine."""
    limits = EngineLimits(131072, 10_000_000)
    plan, problems = plan_for("e0", SweepSettings(cover=10_000), limits)
    assert not problems and plan is not None and plan.prefill_lengths[-1] == 10_000
    plan, _ = plan_for("e0", SweepSettings(cover=1000), limits)
    assert plan is not None and plan.prefill_lengths[-1] == 4096  # within the default already
    plan, problems = plan_for("e3", SweepSettings(cover=600), EngineLimits(512, None))
    assert plan is None and [p.field for p in problems] == ["--cover"]
    assert "e3" in problems[0].problem and "NARWHAL_WORKLOAD_PROMPT_TOKENS" in problems[0].fix
    plan, problems = plan_for("e0", SweepSettings(prefill_lengths=(64, 256), cover=300), limits)
    assert plan is None and [p.field for p in problems] == ["--prefill-lengths"]


def test_explicit_lengths_beyond_the_engine_are_refused_naming_flag_and_engine() -> None:
    settings = SweepSettings(prefill_lengths=(64, 4096), decode_contexts=(64, 4000))
    plan, problems = plan_for("e7", settings, EngineLimits(max_model_len=2048, kv_capacity_tokens=None))
    assert plan is None
    fields = {p.field for p in problems}
    assert fields == {"--prefill-lengths", "--decode-contexts"}
    assert all("e7" in p.problem for p in problems)


def test_decode_contexts_are_held_inside_the_kv_cache_at_the_highest_concurrency() -> None:
    """A decode point that preempts measures recomputation, not decoding."""
    plan, _ = plan_for("e0", SweepSettings(), EngineLimits(max_model_len=8192, kv_capacity_tokens=4000))
    assert plan is not None
    assert 8 * (plan.decode_contexts[-1] + plan.decode_tokens) <= 4000 * 0.8
