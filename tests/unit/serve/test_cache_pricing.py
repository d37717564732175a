"""Placement priced with engine cache state: prefill on the tokens each engine lacks, a request
run whole where its prefix is cached when that is sooner than the split, admission on the same
numbers. The decisions follow the curves and the measured handoff, not a share of hit tokens."""

from __future__ import annotations

import pytest

from narwhal.core.profiles import PrefillCurve
from narwhal.serve.router.scheduling.bookings import handoff_seen
from narwhal.serve.router.scheduling.costs import uncached_s
from narwhal.serve.router.scheduling.engines import Refusal
from narwhal.serve.router.scheduling.scheduler import CurvePriced
from tests.unit.serve.test_scheduler import FIT, Clock, Facts, engine, placed

CURVE = PrefillCurve(a_s=0.01, b_s_per_token=1e-4, c_s_per_token2=1e-8, max_prompt_tokens=8192,
                     **FIT)


def test_a_cached_prefix_is_not_priced_again_but_its_tokens_are_still_attended() -> None:
    assert uncached_s(CURVE, 1000, 0) == pytest.approx(CURVE.seconds(1000))
    # 200 tokens computed, each attending to the 1000 before it: t^2 - held^2
    assert uncached_s(CURVE, 1000, 800) == pytest.approx(0.01 + 1e-4 * 200 + 1e-8 * (1000**2 - 800**2))
    # the last prompt token is always computed
    assert uncached_s(CURVE, 1000, 5000) == uncached_s(CURVE, 1000, 999)


def test_the_prompt_goes_to_the_prefill_engine_that_holds_its_prefix() -> None:
    p0, p1, d0 = engine("p0", "prefill"), engine("p1", "prefill"), engine("d0", "decode")
    chooser = CurvePriced([p0, p1, d0], ttft_s=5.0, tpot_s=0.1, clock=Clock())
    picks = {placed(chooser.place(Facts(price_tokens=2000, cached={"p1": 1900}))).prefill.id
             for _ in range(4)}
    assert picks == {"p1"}
    blind = {placed(chooser.place(Facts(price_tokens=2000))).prefill.id for _ in range(4)}
    assert blind == {"p0", "p1"}  # equal engines share load when no cache tells them apart


def _split_or_local(handoff_s: float, held_on_decode: int, decode_prefill_b: float = 1e-4) -> str:
    p0 = engine("p0", "prefill")
    d0 = engine("d0", "decode", b=decode_prefill_b)
    handoff_seen(d0, handoff_s)
    chooser = CurvePriced([p0, d0], ttft_s=5.0, tpot_s=0.1, clock=Clock())
    p = placed(chooser.place(Facts(price_tokens=2000, max_tokens=16,
                                   cached={"d0": held_on_decode})))
    assert p.cache_local == p.single
    return "local" if p.cache_local else "split"


def test_a_decode_engine_holding_the_conversation_runs_its_next_turn_whole() -> None:
    assert _split_or_local(handoff_s=0.05, held_on_decode=1900) == "local"
    assert _split_or_local(handoff_s=0.05, held_on_decode=0) == "split"


def test_the_same_hit_splits_when_computing_the_rest_there_is_slower_than_the_handoff() -> None:
    # 1000 of 2000 tokens held on d0: at 1e-4 s a token there the rest costs 0.11 s against
    # p0's whole prefill (0.21 s) plus the handoff: local; on a decode engine that prefills
    # ten times slower the rest costs 1.01 s: split, for the same hit
    assert _split_or_local(handoff_s=0.05, held_on_decode=1000) == "local"
    assert _split_or_local(handoff_s=0.05, held_on_decode=1000, decode_prefill_b=1e-3) == "split"
    # and a slow handoff tips a smaller hit to local
    assert _split_or_local(handoff_s=0.02, held_on_decode=300, decode_prefill_b=3e-4) == "split"
    assert _split_or_local(handoff_s=0.6, held_on_decode=300, decode_prefill_b=3e-4) == "local"


def test_admission_prices_ttft_on_the_cached_numbers() -> None:
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    blind = CurvePriced([p0, d0], ttft_s=0.3, tpot_s=0.1, clock=Clock())
    assert isinstance(blind.place(Facts(price_tokens=4000)), Refusal)  # 0.41 s of prefill
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    aware = CurvePriced([p0, d0], ttft_s=0.3, tpot_s=0.1, clock=Clock())
    p = placed(aware.place(Facts(price_tokens=4000, cached={"p0": 3600})))
    assert p.prefill is p0 and p.cached_tokens == 3600 and p.predicted_ttft_s < 0.3


def test_a_busy_decode_engine_keeps_its_streams_rather_than_save_one_request_a_handoff() -> None:
    from narwhal.serve.router.scheduling.bookings import decode_started
    p0 = engine("p0", "prefill")
    d0 = engine("d0", "decode")
    handoff_seen(d0, 0.05)
    chooser = CurvePriced([p0, d0], ttft_s=5.0, tpot_s=0.1, clock=Clock())
    facts = Facts(price_tokens=2000, max_tokens=16, cached={"d0": 1000})
    assert placed(chooser.place(facts)).cache_local  # idle: 0.11 s there beats 0.26 s split
    for _ in range(3):  # three streams there would each wait the 0.11 s prefill: 0.33 s lost
        decode_started(d0, 200)
    assert not placed(chooser.place(facts)).cache_local
