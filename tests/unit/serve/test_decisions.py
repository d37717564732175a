"""The decision table: every way a leg can end, and every settlement, decided in one place.

Walks the whole table (every leg, every end its sink can report, every combination of facts)
and holds it to the rules a client and an operator rely on: one retry rule for both legs,
nothing sent again once the client saw bytes, the KV a producer holds always taken back,
every journal outcome reachable, and shutdown counting what it cut.
"""

from __future__ import annotations

import itertools

import pytest

from narwhal.core.outcomes import FAILED_ON_ENGINE, Outcome
from narwhal.serve.router.request import decisions as D
from narwhal.serve.router.request.decisions import Decision, at_shutdown, decide, every_decision

CASES = [(leg, end, facts) for leg, ends in D.ENDS.items() for end in ends
         for facts in range(D.FACT_BITS)]
RETRYABLE_ENDS = (D.FAILED_BEFORE, D.TIMEOUT_BEFORE, D.ENGINE_5XX)


def test_every_outcome_the_journal_can_record_is_some_rule_s_outcome() -> None:
    reachable = {d.outcome for d in every_decision().values() if d.outcome is not None}
    assert reachable == set(Outcome)


def test_every_leg_end_with_every_combination_of_facts_has_exactly_one_decision() -> None:
    assert len(CASES) == len(D.TABLE) == (5 + 9) * D.FACT_BITS
    for case in CASES:
        assert isinstance(decide(*case), Decision)


def test_an_end_a_leg_cannot_report_is_no_rule() -> None:
    for end in (D.FAILED_MID, D.TIMEOUT_MID, D.CLIENT_GONE, D.CUT):  # a prefill leg is unseen
        with pytest.raises(KeyError):
            decide(D.PREFILL, end, 0)


def test_both_legs_are_sent_elsewhere_by_one_rule() -> None:
    for end, facts in itertools.product(RETRYABLE_ENDS, range(D.FACT_BITS)):
        prefill, decode = decide(D.PREFILL, end, facts), decide(D.DECODE, end, facts)
        assert (prefill.retry, prefill.again) == (decode.retry, decode.again), (end, facts)
        stale = end == D.FAILED_BEFORE and bool(facts & D.STALE)
        assert prefill.again == (stale and not facts & D.GONE)
        assert prefill.retry == (not stale and bool(facts & D.RETRY_OK)), (end, facts)


def test_nothing_is_sent_again_without_tries_left_or_once_the_client_saw_bytes() -> None:
    for leg, end, facts in CASES:
        d = decide(leg, end, facts)
        if d.retry:
            assert facts & D.RETRY_OK and end in RETRYABLE_ENDS
        if d.again:
            assert end == D.FAILED_BEFORE and facts & D.STALE
        if end in (D.FAILED_MID, D.TIMEOUT_MID, D.CLIENT_GONE, D.CUT):
            assert not (d.retry or d.again), (leg, end, facts)


def test_a_stream_the_client_is_reading_is_ended_not_answered_again() -> None:
    for end in (D.FAILED_MID, D.TIMEOUT_MID):
        streamed = decide(D.DECODE, end, D.STREAMING | D.STARTED)
        assert (streamed.reply, streamed.status) == (D.END_STREAM, 200)
        buffered = decide(D.DECODE, end, D.STARTED)
        assert (buffered.reply, buffered.status, buffered.code) == (D.ERROR, 502, "engine_failed")
    cut = decide(D.DECODE, D.CUT, D.STREAMING | D.STARTED)
    assert (cut.reply, cut.status, cut.outcome) == (D.CLOSE, 200, Outcome.CUT_AT_SHUTDOWN)
    before = decide(D.DECODE, D.CUT, D.STREAMING)  # no byte sent yet: a proper 503
    assert (before.reply, before.status, before.code) == (D.ERROR, 503, "router_shutdown")
    assert decide(D.DECODE, D.ANSWERED, D.STREAMING | D.STARTED).reply == D.END_STREAM
    assert decide(D.DECODE, D.ANSWERED, D.STARTED).outcome is None  # reassembled first


def test_health_learns_failures_timeouts_and_answers_and_nothing_from_the_client() -> None:
    for leg, end, facts in CASES:
        health = decide(leg, end, facts).health
        if end == D.FAILED_BEFORE and facts & D.STALE:
            want = D.HEALTH_NONE  # the engine closed an idle connection: no fault of its own
        elif end in (D.FAILED_BEFORE, D.FAILED_MID):
            want = D.HEALTH_FAILED
        elif end in (D.TIMEOUT_BEFORE, D.TIMEOUT_MID):
            want = D.HEALTH_SUSPECT
        elif end in (D.ANSWERED, D.REJECTED):
            want = D.HEALTH_OK
        else:  # a 5xx, the client gone, shutdown
            want = D.HEALTH_NONE
        assert health == want, (leg, end, facts)


def test_a_stale_connection_after_the_client_left_is_neither_blamed_nor_sent_again() -> None:
    for leg in (D.PREFILL, D.DECODE):
        for facts in range(D.FACT_BITS):
            if facts & D.RETRY_OK:
                continue  # the proxy never sets RETRY_OK for a client that left
            d = decide(leg, D.FAILED_BEFORE, facts | D.STALE | D.GONE)
            assert (d.health, d.again, d.retry) == (D.HEALTH_NONE, False, False), (leg, facts)
            assert (d.outcome, d.status, d.reply) == (Outcome.CLIENT_GONE, 499, D.CLOSE)
        # a real failure after the client left still counts against the engine
        assert decide(leg, D.FAILED_BEFORE, D.GONE).health == D.HEALTH_FAILED


def test_the_kv_a_producer_holds_is_taken_back_whenever_no_decode_leg_will_read_it() -> None:
    releasing = {name for name, d in every_decision().items() if d.release_kv}
    # a decode leg that failed or timed out before its first byte settles only when no
    # retry carries the KV to another consumer: then a release leg reads it
    assert releasing == {"decode/rejected", "gone_before_decode", "context_too_long",
                         "decode/stale_connection_client_gone", "decode/failed",
                         "decode/timeout",
                         "decode/rejected@shutdown", "gone_before_decode@shutdown",
                         "context_too_long@shutdown",
                         "decode/stale_connection_client_gone@shutdown",
                         "decode/failed@shutdown", "decode/timeout@shutdown"}


def test_an_engine_s_own_4xx_reaches_the_client_as_it_wrote_it() -> None:
    for leg in (D.PREFILL, D.DECODE):
        d = decide(leg, D.REJECTED, 0)
        assert (d.reply, d.status, d.outcome) == (D.BODY, 0, Outcome.ENGINE_REJECTED)
    explain = decide(D.PREFILL, D.REJECTED, D.OVERFLOW_POSSIBLE)
    assert explain.explain and explain.outcome is None


def test_shutdown_counts_every_request_it_ended_as_cut_and_keeps_its_status() -> None:
    for d in every_decision().values():
        cut = at_shutdown(d)
        if d.outcome is None or d.outcome in (Outcome.OK, Outcome.CUT_AT_SHUTDOWN):
            assert cut is d
        else:
            assert cut.outcome == Outcome.CUT_AT_SHUTDOWN and cut.status == d.status
            assert cut.name == f"{d.name}@shutdown" and every_decision()[cut.name] == cut


def test_rules_of_one_name_agree_on_what_the_journal_and_the_client_see() -> None:
    seen: dict[str, tuple[object, ...]] = {}
    for d in (*D.TABLE.values(), *D.SETTLEMENTS):
        shown = (d.outcome, d.status, d.code, d.message, d.reply, d.health, d.release_kv)
        assert seen.setdefault(d.name, shown) == shown, d.name


def test_messages_name_the_engine_and_fill_every_field() -> None:
    fields = {"engine": "d0", "reason": "reset by peer", "status": 500, "detail": "x",
              "timeout": 30.0}
    for d in every_decision().values():
        text = d.message.format(**fields)
        assert "{" not in text
        engine_s_fault = d.outcome not in (None, Outcome.OK, Outcome.CLIENT_GONE,
                                           Outcome.CUT_AT_SHUTDOWN)
        if d.name.startswith(("prefill/", "decode/")) and engine_s_fault:
            assert "d0" in text, d.name


def test_the_alerting_outcomes_are_outcomes_a_rule_can_record() -> None:
    assert {d.outcome for d in every_decision().values()} >= FAILED_ON_ENGINE
    assert Outcome.OK not in FAILED_ON_ENGINE


def test_an_outcome_is_the_string_the_journal_writes_and_one_dict_key_with_it() -> None:
    assert {Outcome.OK: 1}["ok"] == 1 and f"{Outcome.DECODE_FAILED}" == "decode_failed"


def test_an_answered_leg_ends_by_its_status_class() -> None:
    assert [D.answered(s) for s in (200, 400, 404, 429, 500, 503)] == [
        D.ANSWERED, D.REJECTED, D.REJECTED, D.REJECTED, D.ENGINE_5XX, D.ENGINE_5XX]


def test_a_broken_stream_is_continued_only_when_it_can_be_and_tries_are_left() -> None:
    for leg, end, facts in CASES:
        d = decide(leg, end, facts)
        wanted = (leg == D.DECODE and end in (D.FAILED_MID, D.TIMEOUT_MID)
                  and facts & D.CONTINUABLE and facts & D.RETRY_OK)
        assert d.resume == bool(wanted), (leg, end, facts)
        if d.resume:  # the failed engine is still blamed; the request goes on
            assert d.outcome is None and not (d.retry or d.again)
            assert d.health == (D.HEALTH_FAILED if end == D.FAILED_MID else D.HEALTH_SUSPECT)
        elif facts & D.CONTINUABLE:  # otherwise the fact changes nothing
            assert d == decide(leg, end, facts & ~D.CONTINUABLE), (leg, end, facts)
