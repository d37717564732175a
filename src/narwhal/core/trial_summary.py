"""The capacity trial's summary: one rate's (rate-<r>-summary.json) and the trial's
(summary.json, the rates in the order run), as strict models.

The trial writes each document through these models and the command line reads them back
through the same shape, so a misspelt or missing key fails where it is written, not in a
reader later. Parts that are other documents quoted as they came (the fleet's SLO, the
router's engine rows, Prometheus's `up` answer, journal totals) stay JSON objects here.
`document()` gives the exact key order the trial has always written, and leaves out the
optional parts a rate did not have (a key absent, never null).
"""

from __future__ import annotations

from typing import Any

from narwhal.core.document_io import StrictModel


class Reconciled(StrictModel):
    """The router's journal against what the client sent (first 20 ids of each kind)."""

    ok: bool
    sent: int
    journalled: int
    missing: list[str]
    repeated: list[str]
    unsent: list[str]
    unreadable_rows: int


class RateSummary(StrictModel):
    """One offered rate: what was sent and answered, the percentiles, and the verdict."""

    rate: float
    requests: int
    seconds: float
    ok: int
    attained: int
    attainment: float
    goodput_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    late_sends: int
    client_limited: int
    lag_p99_s: float | None
    statuses: dict[str, int]
    drained_before_s: float
    client_cpu_share: float
    connection_budget: int
    reconciled: Reconciled
    scrape: dict[str, Any]  # Prometheus's `up` and engine labels, or the error
    router_engines: list[dict[str, Any]]
    trace_reuse: dict[str, Any] | None = None  # only when the workload replays a trace
    router_cache: dict[str, Any] | None = None  # only when the journal has cache rows
    continued: dict[str, Any] | None = None  # only when a stream was continued
    verdict: str

    def document(self) -> dict[str, Any]:
        return _without(self.model_dump(), ("trace_reuse", "router_cache", "continued"))


class TrialSummary(StrictModel):
    """The whole trial: the SLO it was judged by, how it was sent, and every rate."""

    slo: dict[str, Any]
    seed: int
    requests_per_rate: int | None
    duration_s: float | None
    tag: str
    rates: list[RateSummary]
    trace: dict[str, Any] | None = None  # the replayed trace, when there is one

    def document(self) -> dict[str, Any]:
        doc = _without(self.model_dump(), ("trace",))
        doc["rates"] = [r.document() for r in self.rates]
        return doc


def _without(doc: dict[str, Any], optional: tuple[str, ...]) -> dict[str, Any]:
    """The document with each optional part it does not have left out (absent, not null)."""
    return {k: v for k, v in doc.items() if not (k in optional and v is None)}
