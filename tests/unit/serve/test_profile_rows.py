"""A fitted row the store would refuse is refused before it is written, naming the field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from narwhal.core.profiles import Generation
from narwhal.serve.profiler.rows import RowRefused, build_row
from narwhal.serve.profiler.sweep import DecodePoint, Measurement, PrefillSample

GEN = Generation(engine_version="0.32.0", process_start_time_seconds=1796046950.45)


def test_a_curve_outside_the_stores_ranges_names_the_field_and_the_limit() -> None:
    # Every prompt length takes 1000 s: the fit is exact, but the store caps a_s at 600 s.
    prefill = [PrefillSample(target_tokens=n, prompt_tokens=n, seconds=1000.0, repeat=0)
               for n in (64, 128, 256, 512, 1024)]
    decode = [DecodePoint(concurrency=c, context_tokens=ctx, running=float(c),
                          resident_tokens=ctx * c, step_s=0.01 + 0.001 * c + 1e-6 * ctx * c,
                          steps=10, prompt_tokens=(ctx,) * c)
              for c in (1, 4) for ctx in (128, 1024)]
    m = Measurement(before=GEN, after=GEN, prefill=prefill, decode=decode)
    with pytest.raises(RowRefused) as info:
        build_row("p0", m, datetime.now(UTC))
    assert "outside what the store accepts (prefill.a_s: input should be less than or equal " \
           "to 600)" in str(info.value)
