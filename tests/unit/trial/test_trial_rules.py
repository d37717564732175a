"""The trial's schedule, reconciliation and verdict rules: what an operator takes to their team."""

from __future__ import annotations

import json

import pytest

from narwhal.deploy.trial.reconcile import cache_totals, continuation_totals, reconcile
from narwhal.deploy.trial.schedule import schedule
from narwhal.deploy.trial.verdict import MAX_LAG_S, Record, summarise, verdict


def test_the_schedule_is_seeded_open_loop_and_at_the_rate() -> None:
    a = schedule(4.0, 2000, 7, 16, 8, "t")
    assert a == schedule(4.0, 2000, 7, 16, 8, "t")  # the same seed, the same trial
    assert a != schedule(4.0, 2000, 8, 16, 8, "t")
    assert [p.at_s for p in a] == sorted(p.at_s for p in a) and a[0].at_s == 0.0
    assert 3.6 < len(a) / a[-1].at_s < 4.4  # Poisson at 4/s
    assert len({p.request_id for p in a}) == 2000 and a[5].request_id == "t-00005"
    with pytest.raises(ValueError):
        schedule(0.0, 10, 0, 16, 8, "t")


def _journal(*ids: str) -> str:
    return "\n".join(json.dumps({"request_id": i, "status": 200}) for i in ids) + "\n"


def test_every_sent_id_once_and_nothing_unsent_reconciles() -> None:
    sent = ["t-00000", "t-00001"]
    assert reconcile(sent, _journal("t-00000", "other-1", "t-00001"), "t").ok
    missing = reconcile(sent, _journal("t-00000"), "t")
    assert not missing.ok and missing.missing == ("t-00001",)
    twice = reconcile(sent, _journal("t-00000", "t-00001", "t-00001"), "t")
    assert twice.repeated == ("t-00001",)
    stray = reconcile(sent, _journal("t-00000", "t-00001", "t-00009"), "t")
    assert stray.unsent == ("t-00009",)
    torn = reconcile(sent, _journal(*sent) + '{"request_id": "t-0', "t")
    assert torn.ok and torn.unreadable_rows == 1


def _record(n: int, lag: float = 0.0, ttft: float = 0.1, status: int = 200) -> Record:
    times = (n + lag + ttft, n + lag + ttft + 0.01, n + lag + ttft + 0.02)
    return Record(f"t-{n}", float(n), n + lag, status, ttft, times, 100)


def test_capacity_is_said_only_when_nothing_else_explains_the_miss() -> None:
    good = summarise(1.0, [_record(n) for n in range(20)], 20.0, 0.5, 0.05)
    assert good["attainment"] == 1.0 and verdict(good, True, True) == "within SLO"
    slow = summarise(1.0, [_record(n, ttft=2.0) for n in range(20)], 20.0, 0.5, 0.05)
    assert verdict(slow, True, True) == "capacity miss"
    assert verdict(slow, True, False) == "scrape failure"
    assert verdict(slow, False, True) == "records do not reconcile"
    late = summarise(1.0, [_record(n, lag=MAX_LAG_S * 3, ttft=2.0) for n in range(20)], 20.0,
                     0.5, 0.05)
    assert verdict(late, True, True) == "client saturated"  # never a capacity claim


def test_failed_requests_count_against_attainment_and_show_by_status() -> None:
    rows = [_record(n) for n in range(8)] + [_record(8, status=503), _record(9, status=503)]
    s = summarise(1.0, rows, 10.0, 0.5, 0.05)
    assert s["attainment"] == 0.8 and s["statuses"] == {"200": 8, "503": 2}
    assert s["goodput_per_s"] == 0.8
    assert verdict(s, True, True) == "capacity miss"  # 503s: the fleet failed them
    refused = summarise(1.0, [_record(n, status=400) for n in range(10)], 10.0, 0.5, 0.05)
    assert verdict(refused, True, True) == "requests refused as invalid"
    admitted_less = summarise(1.0, [_record(n, status=429) for n in range(10)], 10.0, 0.5, 0.05)
    assert verdict(admitted_less, True, True) == "capacity miss"


def test_a_client_that_used_its_whole_core_is_saturated_not_a_capacity_miss() -> None:
    slow = summarise(1.0, [_record(n, ttft=2.0) for n in range(20)], 20.0, 0.5, 0.05)
    slow["client_cpu_share"] = 0.97  # every send on time, but the client was the limit
    assert verdict(slow, True, True) == "client saturated"
    slow["client_cpu_share"] = 0.3
    assert verdict(slow, True, True) == "capacity miss"


def test_a_target_down_is_a_scrape_failure_unless_the_router_has_that_engine_out() -> None:
    from narwhal.deploy.gates.trial import scrape_holds

    snap = {"up": {"engines a:1": "1", "engines b:1": "0", "sidecars b:2": "0",
                   "narwhal-router r:1": "1"},
            "engines": {"engines a:1": "e1", "engines b:1": "e2", "sidecars b:2": "e2",
                        "narwhal-router r:1": ""}}
    assert scrape_holds(snap, 4, {"e2"})  # the fleet lost e2, and the record says so
    assert not scrape_holds(snap, 4, set())  # the router places on e2: the scrape broke
    assert not scrape_holds(snap, 5, {"e2"})  # a target missing from Prometheus
    assert not scrape_holds(None, 4, {"e2"})  # Prometheus did not answer
    router_down = {"up": {**snap["up"], "narwhal-router r:1": "0"}, "engines": snap["engines"]}
    assert not scrape_holds(router_down, 4, {"e2", ""})  # no engine id: never excused


def test_the_connection_budget_is_large_and_leaves_the_process_its_own_descriptors() -> None:
    from narwhal.deploy.trial.client import MAX_CONNECTIONS, connection_budget

    assert connection_budget(1024) == 960  # a default soft limit: still far past any old cap
    assert connection_budget(1_048_576) == MAX_CONNECTIONS
    assert connection_budget(10) == 1


def test_a_rate_held_back_by_the_budget_is_client_limited_before_anything_else() -> None:
    rows = [Record(f"t-{n}", float(n), n + 2.0, 200, 3.0, (n + 5.0,), 100, "", n >= 10)
            for n in range(20)]
    s = summarise(1.0, rows, 20.0, 0.5, 0.05)
    assert s["client_limited"] == 10 and s["late_sends"] == 10  # the budget's waits apart
    assert verdict(s, True, True) == "client-limited"
    assert verdict({**s, "client_limited": 0}, True, True) == "client saturated"


def test_the_routers_cache_hits_are_summed_from_its_journal_rows_and_junk_counts_nothing() -> None:
    rows = [{"request_id": "a", "cache": {"predicted_hit": 64, "observed_hit": 48,
                                          "decision": "split"}},
            {"request_id": "b", "cache": {"predicted_hit": 32, "observed_hit": None,
                                          "decision": "local_cached"}},
            {"request_id": "c", "cache": {"predicted_hit": True, "observed_hit": "9",
                                          "decision": "split"}},
            {"request_id": "d", "cache": "not a dict"},
            {"request_id": "e"}]
    assert cache_totals(rows) == {"requests": 3, "predicted_hit_tokens": 96,
                                  "observed_hit_tokens": 48,
                                  "decisions": {"local_cached": 1, "split": 2}}
    assert cache_totals([{"request_id": "x"}]) is None  # cache awareness off: nothing said


def test_continued_streams_are_counted_from_the_journal_and_junk_counts_nothing() -> None:
    step = {"from": "engine-3", "to": "engine-1", "after_tokens": 4}
    rows = [{"request_id": "a", "outcome": "ok", "continued": [step]},
            {"request_id": "b", "outcome": "ok",
             "continued": [step, {**step, "from": "engine-1", "to": "engine-2"}]},
            {"request_id": "c", "outcome": "decode_failed_midstream", "continued": [step, "x"]},
            {"request_id": "d", "continued": "not a list"}, {"request_id": "e"}]
    assert continuation_totals(rows) == {
        "requests": 3, "continuations": 4, "from_engines": {"engine-1": 1, "engine-3": 3},
        "outcomes": {"decode_failed_midstream": 1, "ok": 2}}
    assert continuation_totals([{"request_id": "x"}]) is None
