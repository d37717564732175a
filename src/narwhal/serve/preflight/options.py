"""The budgets narwhal-check holds a fleet to, each with the flag that changes it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CheckOptions:
    """Settled once from the command line; every gate reads its budget from here."""

    reach_timeout_s: float = 5.0  # --reach-timeout: /health and /version must answer within it
    call_timeout_s: float = 120.0  # --call-timeout: any other call to an engine
    max_fit_error: float = 0.25  # --max-fit-error: a profile's relative RMS fit error
    max_loo_error: float = 0.50  # --max-loo-error: its leave-one-out error
    pace_tokens: int = 128  # --pace-tokens: the cold probe's prompt length
    pace_repeats: int = 3  # --pace-repeats: probes per engine (their median is judged)
    pace_factor: float = 3.0  # --pace-factor: allowed multiple of prediction and fleet median
    pace_slack_s: float = 0.05  # --pace-slack: added to both (HTTP and scheduling overhead)
    events_timeout_s: float = 5.0  # --events-timeout: a publisher answers, its blocks arrive
    kv_tokens: int = 96  # --kv-tokens: the handoff probe's prompt length (several blocks)
    ring: bool = False  # --ring: a subset of pairs, every engine produces and consumes once
    slo_context_tokens: int = 128  # --slo-context: the short context the SLO floors assume
    calibration: Path | None = None  # from the fleet document's calibration section


@dataclass(frozen=True)
class CalibrateOptions:
    """`--calibrate-first-token`: how many samples and how the candidate is derived."""

    repeats: int = 5  # --calibrate-repeats: samples per pair and prompt length
    safety_factor: float = 2.0  # --calibrate-safety: multiplies the worst p95
    max_tokens: int = 1024  # --calibrate-max-tokens: cap on the longest prompt (and the profile's)
    lengths: int = 3  # prompt lengths: max/4, max/2, max
