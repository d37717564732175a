"""The timing model: what a scheduler step costs, as the router's cost curves assume.

Prefill of n new tokens after s already-resident ones costs b*n + c*((s+n)^2 - s^2), plus a once
per request; in one piece that is the quadratic a + b*n + c*n^2 the router fits. A decode step
costs base + per_token * resident_tokens + per_request * running_requests, shared by every
request in the batch. Parameters come from a JSON profile file, then `--emu-*` flags; `slow`
faults multiply every step; zero-delay mode makes every step free (no sleeps at all).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from narwhal.lab.engine.config import EmulatorOptions, StartupError

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class PrefillCurve(BaseModel):
    """Seconds for a prefill of n tokens: a + b*n + c*n^2."""

    model_config = _STRICT
    a: float = Field(default=0.010, ge=0)
    b: float = Field(default=2.0e-5, ge=0)
    c: float = Field(default=2.0e-9, ge=0)


class DecodeCurve(BaseModel):
    """Seconds per decode step: base + per_token*resident_tokens + per_request*running."""

    model_config = _STRICT
    base: float = Field(default=0.006, ge=0)
    per_token: float = Field(default=2.0e-7, ge=0)
    per_request: float = Field(default=5.0e-5, ge=0)


class TimingProfile(BaseModel):
    """The `--emu-timing-profile` file: {"prefill": {...}, "decode": {...}}, both optional."""

    model_config = _STRICT
    prefill: PrefillCurve = PrefillCurve()
    decode: DecodeCurve = DecodeCurve()


class TimingModel:
    """Step costs in seconds; `factor` is the live slow-down (1.0 normally)."""

    def __init__(self, profile: TimingProfile, zero_delay: bool) -> None:
        self.profile = profile
        self.zero_delay = zero_delay
        self.factor = 1.0
        p, d = profile.prefill, profile.decode
        self._a, self._b, self._c = p.a, p.b, p.c
        self._base, self._per_token, self._per_request = d.base, d.per_token, d.per_request

    def prefill_chunk(self, start: int, end: int, first: bool) -> float:
        """Cost of computing tokens [start, end) of one prompt (`first`: the request's first chunk)."""
        if self.zero_delay or end <= start:
            return 0.0
        cost = self._b * (end - start) + self._c * (end * end - start * start)
        return (cost + self._a if first else cost) * self.factor

    def prefill(self, tokens: int) -> float:
        """a + b*n + c*n^2: one whole prefill."""
        return self.prefill_chunk(0, tokens, True) if tokens > 0 else 0.0

    def decode_step(self, running: int, resident_tokens: int) -> float:
        if self.zero_delay or running <= 0:
            return 0.0
        cost = self._base + self._per_token * resident_tokens + self._per_request * running
        return cost * self.factor


def load_timing(emu: EmulatorOptions) -> TimingModel:
    """Profile file (if any), then per-flag overrides; StartupError names the file or flag."""
    data: dict[str, dict[str, float]] = {"prefill": {}, "decode": {}}
    if emu.timing_profile is not None:
        try:
            profile = TimingProfile.model_validate_json(Path(emu.timing_profile).read_bytes())
        except (OSError, ValidationError) as exc:
            raise StartupError(f"argument --emu-timing-profile: {emu.timing_profile}: {exc}") from None
        data = profile.model_dump()
    overrides = emu.timing
    for section, key, value in (
        ("prefill", "a", overrides.prefill_a), ("prefill", "b", overrides.prefill_b),
        ("prefill", "c", overrides.prefill_c), ("decode", "base", overrides.decode_base),
        ("decode", "per_token", overrides.decode_per_token),
        ("decode", "per_request", overrides.decode_per_request),
    ):
        if value is not None:
            data[section][key] = value
    return TimingModel(TimingProfile.model_validate(data), emu.zero_delay)
