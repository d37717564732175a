"""The router's use of the first-token calibration: a deadline below the calibrated one is refused.

A fleet that names a `narwhal.first-token-calibration` document (`calibration: {"path": ...}`,
written by `narwhal-check --calibrate-first-token`, model in core/calibration.py) is refused by
the router when its `serving.first_token_timeout_s` is below the calibrated candidate: such a
deadline would cut off handoffs the fleet was measured to need, and every cut-off request is a
user-visible error.
"""

from __future__ import annotations

from pathlib import Path

from narwhal.core.calibration import Calibration, load_calibration
from narwhal.core.errors import InputError, Problem
from narwhal.core.fleet import FleetDocument, beside


def deadline_problem(deadline_s: float, calibration: Calibration, path: Path,
                     model: str) -> Problem | None:
    """Why a fleet's first-token deadline may not be served under this calibration, if it may not."""
    if calibration.model != model:
        return Problem("calibration.path",
                       f"{path} calibrated model {calibration.model!r}, the fleet serves {model!r}",
                       "re-run narwhal-check --calibrate-first-token on this fleet")
    if deadline_s < calibration.candidate_s:
        return Problem(
            "serving.first_token_timeout_s",
            f"{deadline_s:g} s is below the calibrated candidate {calibration.candidate_s:g} s "
            f"in {path} (rule: {calibration.rule})",
            f"raise serving.first_token_timeout_s to at least {calibration.candidate_s:g}, or "
            "re-calibrate if the fleet got faster")
    return None


def check_fleet_deadline(doc: FleetDocument, fleet_path: Path) -> Calibration | None:
    """The router's startup check: InputError when the deadline is below the calibration's."""
    if doc.calibration is None:
        return None
    path = beside(fleet_path, doc.calibration.path)
    calibration = load_calibration(path)
    problem = deadline_problem(doc.serving.first_token_timeout_s, calibration, path, doc.model)
    if problem is not None:
        raise InputError(str(fleet_path), [problem])
    return calibration
