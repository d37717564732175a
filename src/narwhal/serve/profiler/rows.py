"""From one engine's raw samples to its `ProfileRow`: medians, the two fits, the generation.

Prefill fits `a + b*n + c*n^2` to the median time of each prompt length (repeats smooth out
one-off stalls; the fit sees one point per length). Decode fits `base + per_token*resident +
per_request*running` to each grid point's median step. A row is only made when the engine's
generation after the sweep equals the one before: a restarted engine measured half old, half new.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from narwhal.core.document_io import problems_from
from narwhal.core.profiles import REFERENCE, ProfileRow
from narwhal.serve.profiler.fit import MIN_POINTS, Fit, FitRefused, fit_curve
from narwhal.serve.profiler.sweep import Measurement

MAX_RECORDED_ERROR = 10.0  # the store's ceiling for fit and LOO errors (relative)


class RowRefused(Exception):
    """No row for this engine: too few points, a fit beyond use, or a restart mid-sweep."""


def prefill_points(m: Measurement) -> tuple[list[list[float]], list[float]]:
    """One (design row, median seconds) per prompt length."""
    by_length: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for s in m.prefill:
        by_length[s.target_tokens].append((s.prompt_tokens, s.seconds))
    rows, seconds = [], []
    for length in sorted(by_length):
        samples = by_length[length]
        n = float(statistics.median_low([p for p, _ in samples]))
        rows.append([1.0, n, n * n])
        seconds.append(statistics.median(t for _, t in samples))
    return rows, seconds


def decode_points(m: Measurement) -> tuple[list[list[float]], list[float]]:
    return ([[1.0, float(p.resident_tokens), float(p.running)] for p in m.decode],
            [p.step_s for p in m.decode])


def _fit(engine_id: str, what: str, flag: str, rows: list[list[float]], seconds: list[float]) -> Fit:
    try:
        fit = fit_curve(rows, seconds)
    except FitRefused as exc:
        raise RowRefused(f"{engine_id}: {what} fit refused: {exc} (minimum {MIN_POINTS}); "
                         f"measure more distinct points with {flag}") from None
    if max(fit.fit_error, fit.loo_error) > MAX_RECORDED_ERROR:
        raise RowRefused(f"{engine_id}: {what} fit error {fit.fit_error:.2f} / leave-one-out "
                         f"{fit.loo_error:.2f} is beyond {MAX_RECORDED_ERROR:g}: the engine's "
                         "times do not follow the model; re-run on an idle engine")
    return fit


def build_row(engine_id: str, m: Measurement, measured_at: datetime) -> ProfileRow:
    """The engine's row; RowRefused says why there is none."""
    if m.after is None or m.after != m.before:
        after = m.after.describe() if m.after else "unknown"
        raise RowRefused(f"{engine_id}: the engine restarted during profiling (generation was "
                         f"{m.before.describe()}, now {after}); its curves would mix two "
                         "processes: profile it again")
    p_rows, p_secs = prefill_points(m)
    pre = _fit(engine_id, "prefill", "--prefill-lengths", p_rows, p_secs)
    d_rows, d_secs = decode_points(m)
    dec = _fit(engine_id, "decode", "--decode-contexts / --decode-concurrency", d_rows, d_secs)
    fitted = {
        "engine_id": engine_id, "generation": m.before, "measured_at": measured_at,
        "prefill": {"a_s": pre.coefficients[0], "b_s_per_token": pre.coefficients[1],
                    "c_s_per_token2": pre.coefficients[2], "fit_error": pre.fit_error,
                    "loo_error": pre.loo_error, "samples": len(m.prefill),
                    "max_prompt_tokens": max(s.prompt_tokens for s in m.prefill)},
        "decode": {"base_s": dec.coefficients[0], "per_token_s": dec.coefficients[1],
                   "per_request_s": dec.coefficients[2], "fit_error": dec.fit_error,
                   "loo_error": dec.loo_error, "samples": len(m.decode),
                   "max_requests": max(math.ceil(p.running) for p in m.decode),
                   "max_resident_tokens": max(p.resident_tokens for p in m.decode)},
    }
    try:  # the whole row at once, so every curve's problem is named under its full path
        return ProfileRow.model_validate(fitted)
    except ValidationError as exc:
        fields = "; ".join(f"{p.field}: {p.problem}"
                           for p in problems_from(exc, ProfileRow, reference=REFERENCE))
        raise RowRefused(f"{engine_id}: the fitted curves are outside what the store accepts "
                         f"({fields})") from None


def sample_records(engine_id: str, m: Measurement) -> list[dict[str, Any]]:
    """Every raw sample as one samples-file line: engine, kind, inputs, seconds."""
    gen = m.before.digest()
    out: list[dict[str, Any]] = [
        {"engine_id": engine_id, "generation": gen, "kind": "prefill",
         "inputs": {"target_tokens": s.target_tokens, "prompt_tokens": s.prompt_tokens,
                    "repeat": s.repeat}, "seconds": s.seconds} for s in m.prefill]
    out += [{"engine_id": engine_id, "generation": gen, "kind": "decode",
             "inputs": {"concurrency": p.concurrency, "context_tokens": p.context_tokens,
                        "running": round(p.running, 3), "resident_tokens": p.resident_tokens,
                        "prompt_tokens": list(p.prompt_tokens), "steps": p.steps},
             "seconds": p.step_s} for p in m.decode]
    return out
