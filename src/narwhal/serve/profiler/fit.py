"""Non-negative least squares for the router's three-coefficient cost curves, in pure Python.

A cost curve with a negative coefficient would predict that a longer prompt or a busier batch
is cheaper, which the router would then exploit; so every coefficient is held at zero or above.
With three coefficients the exact NNLS optimum is found by trying every support (2^3 subsets),
solving plain least squares on each and keeping the best solution that is non-negative: the
optimum is the unconstrained fit on its own support, so it is among the candidates.

Residuals are relative (each row divided by its measured time): a 10 ms prefill mispredicted
by 5 ms matters as much to the router as a 1 s prefill mispredicted by 0.5 s. `fit_error` is the
relative RMS error over the points themselves; `loo_error` predicts each point from a fit of all
the others, which is what a curve is worth on a prompt it has not seen.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_POINTS = 4  # three coefficients plus one, so leave-one-out still has something to check
_RANK_TOL = 1e-10


class FitRefused(Exception):
    """The points cannot determine the curve (too few, or all alike)."""


@dataclass(frozen=True)
class Fit:
    """Coefficients (in the order of the design's columns) and how well they predict."""

    coefficients: tuple[float, ...]
    fit_error: float
    loo_error: float
    points: int

    def predict(self, row: Sequence[float]) -> float:
        return _dot(self.coefficients, row)


def _dot(coefficients: Sequence[float], row: Sequence[float]) -> float:
    return sum(c * x for c, x in zip(coefficients, row, strict=True))


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    """Least squares by modified Gram-Schmidt on scaled columns; None when rank-deficient."""
    m, k = len(rows), len(rows[0])
    if m < k:
        return None
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(k)]
    cols = [[r[j] / scale[j] for r in rows] for j in range(k)]
    q: list[list[float]] = []
    r_mat = [[0.0] * k for _ in range(k)]
    for j in range(k):
        v = list(cols[j])
        for i, qi in enumerate(q):
            r_mat[i][j] = sum(a * b for a, b in zip(qi, v, strict=True))
            v = [a - r_mat[i][j] * b for a, b in zip(v, qi, strict=True)]
        norm = math.sqrt(sum(a * a for a in v))
        original = math.sqrt(sum(a * a for a in cols[j]))
        if original == 0.0 or norm <= _RANK_TOL * original:
            return None
        r_mat[j][j] = norm
        q.append([a / norm for a in v])
    rhs = [sum(a * b for a, b in zip(qi, ys, strict=True)) for qi in q]
    beta = [0.0] * k
    for j in reversed(range(k)):
        beta[j] = (rhs[j] - sum(r_mat[j][i] * beta[i] for i in range(j + 1, k))) / r_mat[j][j]
    return [b / s for b, s in zip(beta, scale, strict=True)]


def nnls(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> tuple[float, ...]:
    """min ||X b - y|| subject to b >= 0, exactly, for a handful of columns.

    FitRefused when the full design is rank-deficient (the points do not separate the terms)."""
    k = len(rows[0])
    full = [list(map(float, r)) for r in rows]
    if _lstsq(full, list(ys)) is None:
        raise FitRefused("the points do not separate the curve's terms (too few distinct inputs)")
    best: tuple[float, tuple[float, ...]] = (sum(y * y for y in ys), (0.0,) * k)
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
            sub = [[r[j] for j in support] for r in full]
            beta = _lstsq(sub, list(ys))
            if beta is None or any(b < 0 for b in beta):
                continue
            coef = [0.0] * k
            for j, b in zip(support, beta, strict=True):
                coef[j] = b
            resid = sum((_dot(coef, r) - y) ** 2 for r, y in zip(full, ys, strict=True))
            if resid < best[0]:
                best = (resid, tuple(coef))
    return best[1]


def _relative_nnls(rows: Sequence[Sequence[float]], seconds: Sequence[float]) -> tuple[float, ...]:
    weighted = [[x / y for x in r] for r, y in zip(rows, seconds, strict=True)]
    return nnls(weighted, [1.0] * len(seconds))


def _rel_rms(pairs: Sequence[tuple[float, float]]) -> float:
    return math.sqrt(sum(((p - y) / y) ** 2 for p, y in pairs) / len(pairs))


def fit_curve(rows: Sequence[Sequence[float]], seconds: Sequence[float],
              min_points: int = MIN_POINTS) -> Fit:
    """Fit `seconds ~ rows . b` (b >= 0) minimising relative error; FitRefused below
    `min_points` distinct rows or for a design that cannot separate its terms."""
    if len(rows) != len(seconds):
        raise ValueError("rows and seconds differ in length")
    if any(not (y > 0 and math.isfinite(y)) for y in seconds):
        raise FitRefused("a measured time is not a positive finite number")
    distinct = len({tuple(r) for r in rows})
    if distinct < min_points:
        raise FitRefused(f"{distinct} distinct point(s), at least {min_points} needed")
    coef = _relative_nnls(rows, seconds)
    fit_error = _rel_rms([(_dot(coef, r), y) for r, y in zip(rows, seconds, strict=True)])
    held_out: list[tuple[float, float]] = []
    for i in range(len(rows)):
        rest_rows = [r for j, r in enumerate(rows) if j != i]
        rest_y = [y for j, y in enumerate(seconds) if j != i]
        try:
            loo_coef = _relative_nnls(rest_rows, rest_y)
        except FitRefused:
            # One point alone separates the terms: the curve rests on it, so say so.
            raise FitRefused(f"without point {i + 1} the others cannot separate the curve's "
                             "terms; measure more distinct inputs") from None
        held_out.append((_dot(loo_coef, rows[i]), seconds[i]))
    return Fit(coef, fit_error, _rel_rms(held_out), len(rows))
