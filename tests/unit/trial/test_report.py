"""The report's own arithmetic: engine load from the journal and the record's timeline."""

from __future__ import annotations

from narwhal.deploy.trial.report import AttemptSpan, engine_load, spans_from


def test_each_engine_holds_a_request_from_arrival_to_the_end_of_its_answer() -> None:
    rows = [
        {"received_at": 100.0, "total_s": 2.0, "prefill_engine": "p", "decode_engine": "d"},
        {"received_at": 101.0, "total_s": 2.0, "prefill_engine": "p", "decode_engine": "d"},
        {"received_at": 101.5, "total_s": 0.1, "prefill_engine": None, "decode_engine": "d"},
        {"received_at": "torn", "total_s": 1.0, "prefill_engine": "p"},
    ]
    load = engine_load(rows)
    assert load["p"] == [(0.0, 0), (0.0, 1), (1.0, 2), (2.0, 1), (3.0, 0)]
    assert max(n for _, n in load["d"]) == 3 and load["d"][-1] == (3.0, 0)
    assert engine_load([]) == {} and engine_load([{"total_s": 1}]) == {}


def test_the_timeline_holds_every_finished_attempt_and_skips_unreadable_ones() -> None:
    doc = {"gates": {"discover": {"attempts": ["001", "002"]}},
           "activities": {"load-trial": {"attempts": ["001"]}}}
    attempts = {("discover", "001"): {"started_epoch": 10.0, "duration_s": 3.0,
                                      "verdict": "blocked"},
                ("discover", "002"): {"started_epoch": 20.0, "duration_s": "x",
                                      "verdict": "passed"},
                ("load-trial", "001"): {"started_epoch": 30.0, "duration_s": 9.0,
                                        "verdict": "passed"}}
    assert spans_from(doc, attempts) == [AttemptSpan("discover", "001", 10.0, 3.0, "blocked"),
                                         AttemptSpan("load-trial", "001", 30.0, 9.0, "passed")]
