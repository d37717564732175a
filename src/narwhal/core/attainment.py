"""The SLO attainment target: the share of requests that must meet the SLO for the fleet to be
serving as promised.

One value, read by both Gate G's alert rules (deploy/gates/monitoring.py, the
`NarwhalTtftAttainmentLow` alert) and the capacity trial's verdict (deploy/trial/verdict.py,
"within SLO" or "capacity miss"): the trial measures the rate at which the alert would start
firing, so the two must agree, or a rate the trial calls within SLO pages the operator in
production (or the reverse). It lives in core/ because both deploy modules read it and
neither owns the other.
"""

from __future__ import annotations

TARGET_ATTAINMENT = 0.9
