"""The trial's summaries go through strict models in core/ and come out byte for byte as the
trial has always written them; a misshapen summary is refused where it is written."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from narwhal.core.documents import canonical_json
from narwhal.core.trial_summary import RateSummary, TrialSummary
from narwhal.deploy.trial.reconcile import reconcile_rows
from narwhal.deploy.trial.verdict import Record, summarise, verdict


def _rate(**optional: Any) -> dict[str, Any]:
    """One rate's summary as gates/trial.py's run_rate builds it, key by key."""
    records = [Record(f"t-{i}", i * 0.5, i * 0.5 + 0.01, 200, 0.2, (0.2, 0.25, 0.3), 120)
               for i in range(4)] + [Record("t-4", 2.0, 2.0, 429, None, (), 0)]
    summary = summarise(2.0, records, 2.5, 1.0, 0.1)
    rec = reconcile_rows([r.request_id for r in records],
                         [{"request_id": r.request_id} for r in records], 0)
    summary.update(drained_before_s=0.2, client_cpu_share=0.12, connection_budget=4000,
                   reconciled=rec.as_dict(), scrape={"up": {"engines 10.0.0.1:8001": "1"},
                                                     "engines": {"engines 10.0.0.1:8001": "e1"}},
                   router_engines=[{"id": "e1", "admitted": True, "ejected_reason": None,
                                    "ejections": 0, "held_reason": None}],
                   **optional)
    summary["verdict"] = verdict(summary, rec.ok, True)
    return summary


@pytest.mark.parametrize("optional", [
    {}, {"trace_reuse": {"rows": 5, "blocks": 9, "repeated_block_share": 0.4}},
    {"router_cache": {"requests": 4, "hit_tokens": 10}, "continued": {"requests": 1}}])
def test_a_rate_summary_is_written_byte_for_byte_as_before(optional: dict[str, Any]) -> None:
    built = _rate(**optional)
    kept = RateSummary.model_validate(built).document()
    assert canonical_json(kept) == canonical_json(built)
    assert list(kept) == list(built)  # `narwhal trial --json` prints them in this order


def test_the_trial_summary_keeps_its_key_order_and_leaves_an_absent_trace_out() -> None:
    doc = {"slo": {"ttft_s": 1.0, "tpot_s": 0.1}, "seed": 0, "requests_per_rate": 40,
           "duration_s": None, "tag": "trial-x", "rates": [_rate()]}
    kept = TrialSummary.model_validate(doc).document()
    assert canonical_json(kept) == canonical_json(doc) and list(kept) == list(doc)
    traced = {**doc, "trace": {"file": "t.jsonl", "rows": 3}}
    assert TrialSummary.model_validate(traced).document()["trace"] == traced["trace"]


def test_a_misspelt_or_missing_key_is_refused_where_it_is_written() -> None:
    built = _rate()
    with pytest.raises(ValidationError, match="verdikt"):
        RateSummary.model_validate({**built, "verdikt": built["verdict"]})
    with pytest.raises(ValidationError, match="attainment"):
        RateSummary.model_validate({k: v for k, v in built.items() if k != "attainment"})
