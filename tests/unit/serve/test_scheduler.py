"""The curve-priced chooser: TTFT-minimizing prefill, least-slowed decode, predictive admission."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.errors import InputError
from narwhal.core.fleet import parse_fleet
from narwhal.core.profiles import DecodeCurve, Generation, PrefillCurve, ProfileRow
from narwhal.serve.router.request.call import Call
from narwhal.serve.router.request.relay import DecodeRelay
from narwhal.serve.router.request.upstream import EnginePool
from narwhal.serve.router.scheduling.bookings import (
    DEPARTURE_TAU_S,
    decode_ended,
    decode_reserved,
    decode_started,
    decode_unreserved,
    departures_per_s,
    handoff_seen,
    prefill_ended,
    prefill_started,
)
from narwhal.serve.router.scheduling.bookings import decode_tokens as _decode_tokens
from narwhal.serve.router.scheduling.costs import arrival_s, stream_step_s, waited_s
from narwhal.serve.router.scheduling.engines import Engine, Placement, Refusal
from narwhal.serve.router.scheduling.pricing import (
    TPOT_SPREAD_Z,
    DecodeSeat,
    PrefillSeat,
    arrivals_per_step,
    best_decode,
    best_prefill,
    tpot_bias_s,
    tpot_spread_s,
)
from narwhal.serve.router.scheduling.scheduler import PREFILL_LINE, CurvePriced
from narwhal.serve.router.settings import EngineSpec, settle
from tests.unit.serve.clients import unconnected_client


def decode_tokens(facts: Facts) -> int:
    return _decode_tokens(facts.price_tokens, facts.max_tokens)


FIT = {"fit_error": 0.02, "loo_error": 0.03, "samples": 12}
GEN = Generation(engine_version="0.11.0", process_start_time_seconds=1.0)


@dataclass
class Facts:
    price_tokens: int = 100
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    tenant: str | None = None
    ttft_error_s: float | None = None
    tpot_error_s: float | None = None
    placement: Placement | None = None
    cached: dict[str, int] | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def engine(name: str, role: str, a: float = 0.01, b: float = 1e-4, base: float = 0.01,
           per_token: float = 1e-6, per_request: float = 1e-3) -> Engine:
    spec = EngineSpec(name, "http://h:1", "h", 1, role, role != "decode", role != "prefill",
                      b"h:1")
    e = Engine(spec, EnginePool("h", 1, connect_timeout_s=1, keepalive_s=1))
    e.profile = ProfileRow(
        engine_id=name, generation=GEN, measured_at=datetime(2026, 11, 30, tzinfo=UTC),
        prefill=PrefillCurve(a_s=a, b_s_per_token=b, c_s_per_token2=0.0, max_prompt_tokens=8192,
                             **FIT),
        decode=DecodeCurve(base_s=base, per_token_s=per_token, per_request_s=per_request,
                           max_requests=256, max_resident_tokens=1_000_000, **FIT))
    return e


def placed(result: Placement | Refusal | None) -> Placement:
    assert isinstance(result, Placement)
    return result


def test_prefill_goes_to_the_lowest_predicted_ttft_counting_the_booked_queue() -> None:
    clock = Clock()
    fast, slow, d0 = engine("fast", "prefill"), engine("slow", "prefill", a=0.1, b=1e-3), \
        engine("d0", "decode")
    chooser = CurvePriced([fast, slow, d0], ttft_s=5.0, tpot_s=0.1, clock=clock)
    picks = []
    for _ in range(6):  # a burst: nothing finishes, each placement books its prefill
        p = placed(chooser.place(Facts(price_tokens=1000)))
        picks.append(p.prefill.id)
        prefill_started(p.prefill, 1000, clock.now)
    # fast costs 0.11 s per prefill, slow 1.1 s: slow is worth it only behind 10 fast ones
    assert picks == ["fast"] * 6
    for _ in range(6):
        prefill_started(fast, 1000, clock.now)
    assert placed(chooser.place(Facts(price_tokens=1000))).prefill is slow


def test_measured_ttft_errors_hold_back_what_the_model_alone_would_admit_at_the_ceiling() -> None:
    """Requests that answered later than predicted teach admission a margin: a prompt the
    model prices just under the budget is then refused, and the refusal and /narwhal/state
    show the margin; requests that came back early give room back."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill", a=0.4, b=0.0), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=0.45, tpot_s=0.1, clock=clock)
    first = placed(chooser.place(Facts()))
    # 0.4 prefill + 1.5 steps of d0: about 0.417, under 0.45
    assert first.predicted_ttft_s == pytest.approx(0.4 + 1.5 * 0.0111)
    for _ in range(20):  # each came 50 ms late
        chooser.finished(Facts(ttft_error_s=0.05))
    refusal = chooser.place(Facts())
    assert isinstance(refusal, Refusal) and not refusal.over_tpot
    assert refusal.predicted_ttft_s == pytest.approx(first.predicted_ttft_s + 0.05, abs=0.01)
    margin = chooser.state()["ttft_model_error"]
    assert margin["mean_s"] == pytest.approx(0.05, abs=0.005) and margin["deviation_s"] < 0.01
    for _ in range(20):  # then 30 ms early: the model overprices now, admit again
        chooser.finished(Facts(ttft_error_s=-0.03))
    assert placed(chooser.place(Facts())).predicted_ttft_s == first.predicted_ttft_s
    # a request without a measured error (a retried leg, no first token) teaches nothing
    before = chooser.state()["ttft_model_error"]
    chooser.finished(Facts(ttft_error_s=None))
    assert chooser.state()["ttft_model_error"] == before


def test_a_decode_curve_that_prices_high_is_corrected_by_the_streams_it_ran() -> None:
    """A profile that prices each step 3 ms high refuses streams the engine had room for;
    once streams report their TPOT under the prediction, the engine's bias admits them."""
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.001, b=0.0)
    d0 = engine("d0", "decode", a=0.0, base=0.02, per_token=0.0, per_request=0.001)
    chooser = CurvePriced([p0, d0], ttft_s=5.0, tpot_s=0.0245, clock=clock)
    facts = Facts(max_tokens=10)

    def admitted() -> int:
        n = 0
        while isinstance(placement := chooser.place(facts), Placement):
            n += 1
            decode_started(placement.decode, decode_tokens(facts))
            assert n < 20
        for _ in range(n):
            decode_ended(d0, decode_tokens(facts))
        return n

    assert admitted() == 4  # 0.02 + 0.001 k within 0.0245
    first = placed(chooser.place(facts))
    assert first.predicted_tpot_s == pytest.approx(0.021 + 1e-4 * 0.1)  # and its arrival
    for _ in range(40):  # each ran 3 ms faster than predicted
        chooser.finished(Facts(tpot_error_s=-0.003, placement=first))
    assert d0.load.tpot_error_s == pytest.approx(-0.003, abs=1e-4)
    assert d0.state()["tpot_model_error_s"] == pytest.approx(-0.003, abs=1e-4)
    assert admitted() == 7  # 0.02 + 0.001 k - 0.003 within 0.0245


def test_each_answer_re_anchors_the_queue_and_the_last_one_empties_it() -> None:
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.5, b=0.0)
    cost = prefill_started(p0, 10, clock.now)
    assert cost == pytest.approx(0.5)
    prefill_started(p0, 10, clock.now)
    assert p0.load.busy_until == pytest.approx(101.0)
    clock.now += 0.4  # the first answers sooner than modelled: the other runs from now
    prefill_ended(p0, clock.now, cost)
    assert p0.load.busy_until == pytest.approx(100.9) and p0.load.prefill_queued_s == pytest.approx(0.5)
    clock.now += 0.7  # ... and later than modelled: its answer empties the queue now
    prefill_ended(p0, clock.now, cost)
    assert p0.load.busy_until == clock.now and p0.load.prefill_pending == 0 and p0.load.prefill_queued_s == 0
    prefill_ended(p0, clock.now, cost)  # never below zero
    assert p0.load.prefill_pending == 0


def test_a_flood_is_refused_with_a_retry_after_priced_from_the_queue() -> None:
    clock = Clock()
    p0, d0 = engine("p0", "prefill", a=0.4, b=0.0), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=1.9, tpot_s=0.1, clock=clock)
    outcomes = []
    for _ in range(7):
        result = chooser.place(Facts())
        outcomes.append(result)
        if isinstance(result, Placement):
            prefill_started(result.prefill, 100, clock.now)
    assert [isinstance(r, Placement) for r in outcomes] == [True] * 4 + [False] * 3
    refusal = outcomes[-1]
    assert isinstance(refusal, Refusal)
    # 1.6 queued + 0.4, and 1.5 of d0's steps (0.01 + 100 x 1e-6 + 1e-3) to the first token
    assert refusal.predicted_ttft_s == pytest.approx(2.0 + 1.5 * 0.0111)
    assert refusal.retry_after_s == 1
    assert (chooser.admitted, chooser.refused) == (4, 3)
    # Turned away by prefill, the three are still decode demand for the planner: each would
    # have held d0 for its length (one step when unknown) at the step it was priced at.
    assert chooser.refused_decode_stream_s == pytest.approx(3 * 0.0111)
    clock.now += 0.4  # the first answers: the queue drains, admitted again
    prefill_ended(p0, clock.now, 0.4)
    clock.now += 0.1
    assert isinstance(chooser.place(Facts()), Placement)
    for _ in range(20):
        prefill_started(p0, 100, clock.now)
    big = chooser.place(Facts())
    assert isinstance(big, Refusal) and big.retry_after_s == 8  # ceil(9.6 + 0.4 - 1.9)
    state = chooser.state()
    assert state["refused"] == 4 and state["last_refusal"]["retry_after_s"] == 8


def test_retries_are_never_refused_and_skip_the_engines_already_tried() -> None:
    clock = Clock()
    p0, p1, d0 = engine("p0", "prefill", a=5.0), engine("p1", "prefill", a=6.0), \
        engine("d0", "decode")
    chooser = CurvePriced([p0, p1, d0], ttft_s=1.0, tpot_s=0.1, clock=clock)
    assert isinstance(chooser.place(Facts()), Refusal)
    assert chooser.another_prefill(Facts(), [p0]) is p1
    assert chooser.another_prefill(Facts(), [p0, p1]) is None
    p1.held = "reprofile"
    assert chooser.another_prefill(Facts(), [p0]) is None
    p1.held = ""
    p1.profile = None  # never priced by a curve it does not have
    assert chooser.another_prefill(Facts(), [p0]) is None


def test_decode_goes_where_the_request_slows_steps_least_within_the_tpot_budget() -> None:
    clock = Clock()
    p0 = engine("p0", "prefill")
    cheap_tokens = engine("d_tok", "decode", per_token=1e-7, per_request=2e-3)
    cheap_reqs = engine("d_req", "decode", per_token=1e-5, per_request=1e-4)
    chooser = CurvePriced([p0, cheap_tokens, cheap_reqs], ttft_s=5.0, tpot_s=0.1, clock=clock)
    long = Facts(price_tokens=4000, max_tokens=200)  # 4100 resident tokens
    assert placed(chooser.place(long)).decode is cheap_tokens
    short = Facts(price_tokens=10)
    assert placed(chooser.place(short)).decode is cheap_reqs
    # the least-slowed engine is over budget: the one still within it wins
    decode_started(cheap_tokens, 1_000_000)
    assert placed(chooser.place(long)).decode is cheap_reqs
    decode_ended(cheap_tokens, 1_000_000)
    assert (cheap_tokens.load.running, cheap_tokens.load.resident_tokens) == (0, 0)


@pytest.mark.parametrize("lined", [True, False])
def test_the_chooser_agrees_with_the_pricing_functions(lined: bool) -> None:
    clock = Clock()
    engines = [engine(f"p{i}", "prefill", a=0.01 * (i + 1), b=1e-4 * (3 - i)) for i in range(3)]
    decodes = [engine(f"d{i}", "decode", base=0.005 * (i + 1), per_token=1e-6 * (3 - i),
                      per_request=1e-3 * i) for i in range(3)]
    chooser = CurvePriced([*engines, *decodes], ttft_s=2.0, tpot_s=0.05, clock=clock)
    if not lined:  # every prompt sent when placed, as a plain request's is
        for e in engines:
            e.prefill_line = 0
    for i, e in enumerate(engines):
        for k in range(i):  # staggered: p2's second prefill waits behind its first
            clock.now = 100.0 + 0.001 * k
            prefill_started(e, 500, clock.now)
    clock.now = 100.01
    # behind the line a newcomer joins no batch, so nobody it would batch with waits
    assert waited_s(engines[2], clock.now) == pytest.approx(0.0 if lined else 0.009)
    for i, e in enumerate(decodes):
        for _ in range(3 - i):
            decode_started(e, 3000, 0.02 * i)
    for tokens in (10, 300, 3000):
        facts = Facts(price_tokens=tokens, max_tokens=64)
        p = placed(chooser.place(facts))
        seats = [PrefillSeat(e.id, e.profile.prefill, max(0.0, e.load.busy_until - clock.now),
                             waited_s(e, clock.now))
                 for e in engines if e.profile]
        want = best_prefill(seats, tokens, 2.0)
        assert want is not None and p.prefill.id == want.key
        dseats = [DecodeSeat(e.id, e.profile.decode, e.load.resident_tokens, e.load.running,
                             e.load.arrival_rate, arrival_s(e.profile))
                  for e in decodes if e.profile]
        dwant = best_decode(dseats, decode_tokens(facts), 0.05, arrivals_per_step(64), steps=64)
        assert dwant is not None and p.decode.id == dwant.key


def test_a_tie_on_a_both_engine_keeps_the_request_plain() -> None:
    clock = Clock()
    b0, b1 = engine("b0", "both"), engine("b1", "both")
    chooser = CurvePriced([b0, b1], ttft_s=5.0, tpot_s=0.1, clock=clock)
    for _ in range(4):
        assert placed(chooser.place(Facts())).single


def test_the_prompt_estimate_is_bytes_over_four_until_the_engine_tells_the_count() -> None:
    text = "x" * 4000
    conn = unconnected_client()
    call = Call({"prompt": text, "max_tokens": 10}, False, b"r1", None, conn)
    assert 1000 <= call.price_tokens <= 1010
    call.prompt_tokens = 7
    assert call.price_tokens == 7
    ids = Call({"prompt": list(range(321))}, False, b"r2", None, conn)
    assert ids.price_tokens == 321
    chat = Call({"messages": [{"role": "user", "content": "y" * 400}]}, True, b"r3", None, conn)
    assert 100 <= chat.price_tokens <= 120
    assert decode_tokens(call) == 7 + 5


def test_near_capacity_the_tenant_over_its_share_is_refused_first() -> None:
    clock = Clock()
    # a decode engine whose step is free: the TTFT is the prefill queue's alone
    p0 = engine("p0", "prefill", a=0.1, b=0.0)
    d0 = engine("d0", "decode", base=0.0, per_token=0.0, per_request=0.0)
    chooser = CurvePriced([p0, d0], ttft_s=1.0, tpot_s=0.1, clock=clock,
                          weights={"big": 1.0, "small": 1.0})

    def ask(tenant: str) -> Placement | Refusal | None:
        result = chooser.place(Facts(tenant=tenant))
        if isinstance(result, Placement):
            prefill_started(result.prefill, 100, clock.now)
        return result

    # alone, "big" may use the whole budget
    assert all(isinstance(ask("big"), Placement) for _ in range(7))  # queue 0.7 s
    # "small" arrives: it is within its share, so the last quarter of the budget is its
    assert isinstance(ask("small"), Placement)  # predicted 0.8
    refused = ask("big")  # predicted 0.9 > 0.75 and big holds 7 of 8 in flight
    assert isinstance(refused, Refusal) and refused.over_share
    assert refused.retry_after_s == 1 and refused.ttft_budget_s == 0.75
    assert isinstance(ask("small"), Placement)  # predicted 0.9: small has 1 of 8
    capacity = ask("small")  # predicted 1.0 is still within the budget
    assert isinstance(capacity, Placement)
    full = ask("small")
    assert isinstance(full, Refusal) and not full.over_share  # over the budget: anyone
    assert (chooser.refused, chooser.refused_over_share) == (1, 1)
    state = chooser.state()
    assert state["inflight_by_tenant"] == {"big": 7, "small": 3}
    for tenant in ["big"] * 7 + ["small"] * 3:
        chooser.finished(Facts(tenant=tenant))
    assert chooser.state()["inflight_by_tenant"] == {}
    chooser.finished(Facts(tenant="big"))  # never below zero
    assert chooser.state()["inflight_by_tenant"] == {}


def test_weights_set_the_shares() -> None:
    chooser = CurvePriced([], ttft_s=1.0, tpot_s=0.1, weights={"gold": 3.0, "tin": 1.0})
    chooser._inflight, chooser._total = {"gold": 5, "tin": 1}, 6
    assert chooser.over_share("gold")  # one more: 6 of 7 > 3/4 of 7 = 5.25
    assert chooser.over_share("tin")  # one more: 2 > 1/4 of 7 = 1.75
    chooser._inflight, chooser._total = {"gold": 6}, 6
    assert not chooser.over_share("tin")  # its first: 1 <= 1.75
    chooser._inflight, chooser._total = {"gold": 4, "tin": 2}, 6
    assert not chooser.over_share("gold")  # 5 <= 5.25
    assert chooser.over_share("tin")  # 3 > 1.75
    assert not chooser.over_share(None)  # a newcomer (unnamed: weight 1) is within its share


@pytest.mark.parametrize("weight", [0, -1, "2", None, float("nan"), 1001])
def test_a_tenant_weight_must_be_a_positive_number(weight: object) -> None:
    doc = {"schema": "narwhal.fleet", "schema_version": 1, "model": "m",
           "engines": [{"id": "b0", "url": "http://10.0.0.5:8000", "role": "both"}],
           "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "j.jsonl"},
           "tenants": [{"name": "a", "key_env": "NW_KEY_A", "weight": weight}]}
    with pytest.raises(InputError) as info:
        parse_fleet(doc, "fleet.json")
    assert any(p.field == "tenants[0].weight" for p in info.value.problems)


def test_tenant_weights_reach_the_settings(tmp_path: Path) -> None:
    doc = parse_fleet({"schema": "narwhal.fleet", "schema_version": 1, "model": "m",
                       "engines": [{"id": "b0", "url": "http://10.0.0.5:8000", "role": "both"}],
                       "slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "journal": {"path": "j.jsonl"},
                       "tenants": [{"name": "a", "key_env": "NW_KEY_A", "weight": 3},
                                   {"name": "b", "key_env": "NW_KEY_B"}]}, "fleet.json")
    settings = settle(doc, {"NW_KEY_A": "a" * 32, "NW_KEY_B": "b" * 32}, tmp_path / "f.json")
    assert settings.tenants.weights == {"a": 3.0, "b": 1.0}


def test_a_newcomer_is_priced_by_the_oldest_prefill_it_would_batch_with() -> None:
    # Every prefill costs 0.2 s; the engine runs all waiting prefills in its next step, so
    # those answer together when that step ends. Here every prompt is sent when placed (no
    # prefill line), as a plain request's is.
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.2, b=0.0)
    d0 = engine("d0", "decode", base=0.001, per_token=0.0, per_request=0.0)
    chooser = CurvePriced([p0, d0], ttft_s=0.47, tpot_s=0.1, clock=clock)
    p0.prefill_line = 0
    start = clock.now

    def ask(at: float) -> Placement | Refusal | None:
        clock.now = start + at
        result = chooser.place(Facts())
        if isinstance(result, Placement):
            prefill_started(result.prefill, 100, clock.now)
        return result

    assert isinstance(ask(0.0), Placement)  # A runs alone from 0 to 0.2
    assert isinstance(ask(0.1), Placement)  # B waits for the next step: 0.2 to 0.4
    # C alone would answer at 0.6 (TTFT 0.45, within 0.47), but it joins B's step, which then
    # ends at 0.6 too: B, admitted on 0.3 s, would wait 0.5 s. C is refused for B's sake.
    late = ask(0.15)
    assert isinstance(late, Refusal) and not late.over_tpot
    assert late.predicted_ttft_s == pytest.approx(0.05 + 0.25 + 0.2 + 1.5 * 0.001)
    # At 0.25 A should have answered; until it does, B still waits (the engine runs slower
    # than modelled): 0.15 waited + 0.15 queued + 0.2 = 0.5, refused.
    assert isinstance(ask(0.25), Refusal)
    prefill_ended(p0, start + 0.26, 0.2)  # A answers: B's step runs from now to 0.46
    assert p0.load.busy_until == pytest.approx(start + 0.46)
    assert isinstance(ask(0.27), Placement)  # waits alone behind it: 0.19 + 0.2 = 0.39
    for _ in range(2):
        prefill_ended(p0, start + 0.5, 0.2)
    assert p0.load.prefill_pending == 0 and p0.load.busy_until == start + 0.5


def test_behind_the_prefill_line_a_newcomer_waits_its_turn_and_delays_nobody() -> None:
    """The same arrivals through the router's prefill line: C waits in the router behind B
    instead of joining B's step, so B still answers at 0.4 and C, alone after it at 0.6
    (TTFT 0.45), is admitted where the batch would have refused it."""
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.2, b=0.0)
    d0 = engine("d0", "decode", base=0.001, per_token=0.0, per_request=0.0)
    chooser = CurvePriced([p0, d0], ttft_s=0.47, tpot_s=0.1, clock=clock)
    assert p0.prefill_line == PREFILL_LINE == 2
    start = clock.now
    for at in (0.0, 0.1):
        clock.now = start + at
        prefill_started(placed(chooser.place(Facts())).prefill, 100, clock.now)
    clock.now = start + 0.15
    late = placed(chooser.place(Facts()))
    assert late.predicted_ttft_s == pytest.approx(0.25 + 0.2 + 1.5 * 0.001)
    prefill_started(p0, 100, clock.now)
    clock.now = start + 0.3  # a fourth would answer after C, at 0.8 (TTFT 0.5): refused
    assert isinstance(chooser.place(Facts()), Refusal)


def test_a_prefill_never_sent_moves_the_queue_up_by_its_cost_without_re_anchoring() -> None:
    """A request that ends before its prefill leg is sent (its client left while the prompt
    waited in the line) takes back only its own booking: the engine's step did not end, so
    the queue is not re-anchored on the clock, as an answer re-anchors it."""
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.2, b=0.0)
    start = clock.now
    for _ in range(3):
        prefill_started(p0, 100, start)
    assert p0.load.busy_until == pytest.approx(start + 0.6)
    prefill_ended(p0, start + 0.1, 0.2, answered=False)  # the third, unsent
    assert p0.load.prefill_pending == 2 and p0.load.busy_until == pytest.approx(start + 0.4)
    prefill_ended(p0, start + 0.25, 0.2)  # the first answers late: re-anchored on the clock
    assert p0.load.busy_until == pytest.approx(start + 0.45)
    prefill_ended(p0, start + 0.3, 0.2, answered=False)
    assert p0.load.prefill_pending == 0 and p0.load.busy_until == start + 0.3


def test_the_first_decode_step_is_part_of_the_predicted_ttft() -> None:
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.9, b=0.0)
    d0 = engine("d0", "decode", base=0.05, per_token=0.0, per_request=0.0)
    chooser = CurvePriced([p0, d0], ttft_s=0.95, tpot_s=0.1, clock=clock)
    # 0.9 s of prefill fits the budget alone, but the first token comes about one and a half
    # decode steps after the handoff: 0.9 + 0.075 misses it.
    refused = chooser.place(Facts())
    assert isinstance(refused, Refusal)
    assert refused.predicted_ttft_s == pytest.approx(0.975)


def test_no_decode_engine_within_the_tpot_budget_means_a_tpot_refusal() -> None:
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.001, b=0.0)
    # d0's own prefill constant prices each arriving decode leg: 0.01 s + 1e-4 for its token.
    d0 = engine("d0", "decode", a=0.01, base=0.02, per_token=0.0, per_request=0.001)
    chooser = CurvePriced([p0, d0], ttft_s=5.0, tpot_s=0.0245, clock=clock)
    facts = Facts(max_tokens=10)  # a new stream every 10 steps per stream: 0.1 arrivals a step
    admitted = []
    while isinstance(placement := chooser.place(facts), Placement):
        admitted.append(placement)
        decode_started(placement.decode, decode_tokens(facts), 0.1)
        assert len(admitted) < 10
    # step after k streams: 0.02 + 0.001 k + 0.0101 * 0.1 k (without the arrivals 5 would
    # fit); a stream's own TPOT over its 10 steps spreads by 0.0101 * sqrt(0.1 k / 10): the
    # second's mean step, 0.02404 s, fits the budget, but not with half its spread (0.02475 s)
    assert len(admitted) == 1
    refusal = placement
    assert isinstance(refusal, Refusal) and refusal.over_tpot and not refusal.over_share
    assert refusal.predicted_tpot_s == pytest.approx(0.02 + 0.002 + 0.00202
                                                     + 0.5 * 0.0101 * (0.2 / 10) ** 0.5)
    assert refusal.tpot_budget_s == 0.0245 and refusal.retry_after_s == 1
    assert (chooser.admitted, chooser.refused, chooser.refused_tpot) == (1, 0, 1)
    # the refused stream still counts as decode demand: 10 tokens at its priced step
    lasts = 10 * (0.02 + 0.002 + 0.00202)
    assert chooser.refused_decode_stream_s == pytest.approx(lasts)
    assert chooser.refused_decode_token_s == pytest.approx(lasts * decode_tokens(facts))
    assert chooser.refused_decode_arrival_s == pytest.approx(lasts * 0.1)
    state = chooser.state()
    assert state["refused_tpot"] == 1 and state["last_refusal"]["over_tpot"]
    assert state["decode_step_s"]["d0"] == pytest.approx(0.02 + 0.001 + 0.00101)
    # a retry of a failed decode leg is never refused: the least-bad engine
    assert chooser.another_decode(facts, []) is d0
    decode_ended(d0, decode_tokens(facts), 0.1)
    assert (d0.load.running, d0.load.resident_tokens, d0.load.arrival_rate) == (0, 0, 0.0)
    assert isinstance(chooser.place(facts), Placement)  # the stream ended: room again


def test_a_measured_handoff_longer_than_the_step_model_counts_against_the_ttft_budget() -> None:
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.2, b=0.0)
    d0 = engine("d0", "decode", base=0.01, per_token=0.0, per_request=0.0)
    chooser = CurvePriced([p0, d0], ttft_s=0.25, tpot_s=0.1, clock=clock)
    assert isinstance(chooser.place(Facts()), Placement)  # 0.2 + 1.5 x 0.011 s modelled
    handoff_seen(d0, 0.06)
    assert d0.load.handoff_s == 0.06  # the first measurement stands alone
    refused = chooser.place(Facts())
    assert isinstance(refused, Refusal) and refused.predicted_ttft_s == pytest.approx(0.26)
    for _ in range(40):  # the handoff gets fast again: the average follows
        handoff_seen(d0, 0.001)
    assert d0.load.handoff_s < 0.002
    assert isinstance(chooser.place(Facts()), Placement)  # the step model's allowance again


def test_a_burst_of_placements_sees_the_decode_work_it_reserved() -> None:
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.001, b=0.0)
    d0 = engine("d0", "decode", a=0.0, b=0.0, base=0.02, per_token=0.0, per_request=0.01)
    chooser = CurvePriced([p0, d0], ttft_s=5.0, tpot_s=0.05, clock=clock)
    facts = Facts(max_tokens=40)
    # five at once, none decoding yet: each placement reserves its stream on d0
    results = []
    for _ in range(5):
        result = chooser.place(facts)
        results.append(result)
        if isinstance(result, Placement):
            decode_reserved(result.decode, decode_tokens(facts), 0.025)
    assert [isinstance(r, Placement) for r in results] == [True] * 3 + [False] * 2
    assert d0.load.reserved == 3 and d0.load.running == 0
    # the three start and one more is reserved: with no stream ended yet, none is assumed to
    # end before the newcomer starts, so 3 running + 1 reserved + 1 = 0.07 s
    for _ in range(3):
        decode_unreserved(d0, decode_tokens(facts), 0.025)
        decode_started(d0, decode_tokens(facts), 0.025)
    decode_reserved(d0, decode_tokens(facts), 0.025)
    assert isinstance(chooser.place(facts), Refusal)
    decode_started(d0, decode_tokens(facts), 0.025)  # a fourth starts and ends at once:
    decode_ended(d0, decode_tokens(facts), 0.025, now=clock.now)  # 3 running, 1 reserved
    # one ended a moment ago (about 0.2 per second): over the newcomer's 1 ms prefill almost
    # none of the other three will, so 3 + 1 + 1 streams still price over the budget
    assert departures_per_s(d0, clock.now) == pytest.approx(1 / DEPARTURE_TAU_S)
    assert isinstance(chooser.place(facts), Refusal)
    decode_ended(d0, decode_tokens(facts), 0.025, now=clock.now)
    assert isinstance(chooser.place(facts), Refusal)  # 2 running, 1 reserved: 0.06 s
    decode_ended(d0, decode_tokens(facts), 0.025, now=clock.now)
    assert isinstance(chooser.place(facts), Placement)  # 1 running, 1 reserved: 0.05 s
    assert (d0.load.reserved, d0.load.reserved_tokens) == (1, decode_tokens(facts))


def test_in_steady_state_the_streams_that_end_make_room_for_the_reserved_ones() -> None:
    """Streams end at the measured rate while the newcomer's prefill runs: over a window
    that long as many end as the reserved ones start, so the running count stands; never
    fewer than that (a reserved stream is not offset by more endings than it)."""
    clock = Clock()
    p0 = engine("p0", "prefill", a=0.5, b=0.0)  # a 0.5 s prefill: the window
    d0 = engine("d0", "decode", a=0.0, b=0.0, base=0.02, per_token=0.0, per_request=0.01)
    chooser = CurvePriced([p0, d0], ttft_s=5.0, tpot_s=0.06, clock=clock)
    facts = Facts(max_tokens=40)
    tokens = decode_tokens(facts)
    for _ in range(3):
        decode_started(d0, tokens)
    decode_reserved(d0, tokens, 0.0)
    # no departure measured: 3 + 1 + 1 = 5 streams, 0.07 s
    assert isinstance(chooser.place(facts), Refusal)
    # 20 streams ended over the last 5 s (4 a second, 2 in the 0.5 s window): the one
    # reserved stream is offset by one that ends, 3 + 1 - 1 + 1 = 4 streams, 0.06 s
    for k in range(20):
        decode_started(d0, tokens)
        decode_ended(d0, tokens, now=clock.now - 5.0 + k * 0.25)
    assert departures_per_s(d0, clock.now) > 2.0
    placed = chooser.place(facts)
    assert isinstance(placed, Placement) and placed.predicted_tpot_s == pytest.approx(0.06)


def test_a_plain_request_on_a_both_engine_is_not_charged_a_kv_arrival() -> None:
    clock = Clock()
    # a slow prefill constant: a pulled-KV arrival would cost 1.2 s of every stream's step
    b0 = engine("b0", "both", a=1.2, b=0.0, base=0.005, per_token=0.0, per_request=0.0)
    chooser = CurvePriced([b0], ttft_s=3.9, tpot_s=0.1, clock=clock)
    placement = placed(chooser.place(Facts(max_tokens=3)))
    assert placement.single and chooser.refused_tpot == 0


def _overflowing(tpot_s: float = 0.05) -> tuple[Clock, CurvePriced, Engine, Engine]:
    """p0 prefills with 0.33 s queued (over a 0.3 s TTFT budget); b1 is a `both` engine the
    role controller put in the decode pool."""
    clock = Clock()
    p0, b1 = engine("p0", "prefill"), engine("b1", "both")
    b1.serves_prefill = False
    chooser = CurvePriced([p0, b1], ttft_s=0.3, tpot_s=tpot_s, clock=clock, overflow=True)
    for _ in range(3):
        prefill_started(p0, 1000, clock.now)
    return clock, chooser, p0, b1


def test_a_request_no_split_can_serve_in_time_runs_whole_on_a_decode_pool_engine() -> None:
    """Overflow: with the prefill pool full, a `both` engine in the decode pool prefills and
    decodes the request itself when both budgets hold; counted, shown in state."""
    _clock, chooser, _p0, b1 = _overflowing()
    decode_started(b1, 200, 0.1, 12, "s1")  # 11 gaps absorb one 0.11 s step
    p = placed(chooser.place(Facts(price_tokens=1000, max_tokens=8)))
    assert p.single and p.decode is b1
    # the step running when it arrives, then the step carrying its 0.11 s prefill
    assert 0.11 < p.predicted_ttft_s < 0.3
    assert chooser.state()["overflow"]["to_decode_pool"] == 1 and chooser.admitted == 1


def test_a_one_token_request_is_refused_only_for_the_streams_it_would_push_past() -> None:
    """A `max_tokens: 1` request has no gap between tokens, so no TPOT of its own: on an idle
    decode engine it is admitted however tight the budget; on one where its landing and its
    one step would push a running stream past the budget, it is refused (TTFT leaves no
    room to hold it until that stream ends)."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=0.06, tpot_s=0.015, clock=clock)
    one = placed(chooser.place(Facts(max_tokens=1)))
    assert one.decode is d0
    # a stream of 3 tokens with its first out: two steps of 0.0111 s ahead, TPOT 0.0111 s;
    # the newcomer's landing (0.0101 s) and its step's share (0.0011 s) make it 0.0167 s
    relay = DecodeRelay(lambda _r: None, 1.0, 1.0)
    relay.events, relay.t_first, relay.t_last = 1, clock.now, clock.now
    decode_started(d0, 100, 1 / 3, 3, "s1", relay)
    refusal = chooser.place(Facts(max_tokens=1))
    assert isinstance(refusal, Refusal) and refusal.over_tpot
    assert refusal.predicted_tpot_s == pytest.approx(0.0167, abs=1e-6)
    roomy = CurvePriced([p0, d0], ttft_s=0.06, tpot_s=0.017, clock=clock)
    assert placed(roomy.place(Facts(max_tokens=1))).decode is d0


def test_without_overflow_the_request_path_keeps_no_stream_bookkeeping() -> None:
    """Only the overflow paths read an engine's streams and prefill share; a chooser without
    overflow (any fleet not under the planner) leaves both untouched."""
    clock = Clock()
    p0, b1 = engine("p0", "prefill"), engine("b1", "both")
    CurvePriced([p0, b1], ttft_s=0.3, tpot_s=0.05, clock=clock)
    decode_started(b1, 200, 0.1, 12, "s1")
    prefill_started(b1, 1000, clock.now)
    assert b1.load.streams == {} and b1.load.prefill_work == 0.0
    CurvePriced([p0, b1], ttft_s=0.3, tpot_s=0.05, clock=clock, overflow=True)
    decode_started(b1, 200, 0.1, 12, "s2")
    prefill_started(b1, 1000, clock.now)
    assert b1.load.streams == {"s2": [11.0, pytest.approx(0.11)]} and b1.load.prefill_work > 0.0


def test_overflow_never_delays_a_split_leg_about_to_land_past_its_ttft() -> None:
    """A split request whose decode leg is reserved on the decode-pool engine gets its first
    token after any overflow prefill running there when its KV lands: an overflow that
    would push it past its TTFT budget is refused; one received just now has the room."""
    clock, chooser, _p0, b1 = _overflowing()
    decode_reserved(b1, 200, 0.1, False, "old", clock.now - 0.25)  # 50 ms of budget left
    refusal = chooser.place(Facts(price_tokens=1000, max_tokens=8))
    assert isinstance(refusal, Refusal) and chooser.state()["overflow"]["to_decode_pool"] == 0
    decode_unreserved(b1, 200, 0.1, False, "old")
    assert b1.load.landing == {}
    decode_reserved(b1, 200, 0.1, False, "new", clock.now - 0.05)
    p = placed(chooser.place(Facts(price_tokens=1000, max_tokens=8)))
    assert p.single and p.decode is b1


def test_a_split_leg_landing_behind_an_overflow_prefill_is_priced_with_that_wait() -> None:
    """A split placement onto a decode engine that runs an overflow request's prefill: its
    first token comes after that prefill ends, and admission prices it so."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "both")
    d0.serves_prefill = False
    chooser = CurvePriced([p0, d0], ttft_s=5.0, tpot_s=0.1, clock=clock, overflow=True)
    quiet = placed(chooser.place(Facts(price_tokens=100)))
    for _ in range(4):  # 0.44 s of overflow prefill queued on d0
        prefill_started(d0, 1000, clock.now)
    behind = placed(chooser.place(Facts(price_tokens=100)))
    assert behind.decode is d0
    # p0 answers in 0.02 s; d0's prefills end 0.42 s after that
    assert behind.predicted_ttft_s - quiet.predicted_ttft_s == pytest.approx(0.42, abs=0.02)


def test_without_overflow_no_landing_legs_are_kept() -> None:
    clock = Clock()
    p0, b1 = engine("p0", "prefill"), engine("b1", "both")
    CurvePriced([p0, b1], ttft_s=0.3, tpot_s=0.05, clock=clock)
    decode_reserved(b1, 200, 0.1, False, "leg", clock.now)
    assert b1.load.landing == {} and b1.load.reserved == 1


def test_overflow_never_stretches_a_short_stream_past_its_tpot_budget() -> None:
    clock, chooser, _p0, b1 = _overflowing()
    decode_started(b1, 200, 0.25, 4, "short")  # 3 gaps x (0.05 - ~0.013) < 0.11: it would miss
    refusal = chooser.place(Facts(price_tokens=1000, max_tokens=8))
    assert isinstance(refusal, Refusal) and not refusal.over_tpot
    assert chooser.state()["overflow"]["to_decode_pool"] == 0
    decode_ended(b1, 200, 0.25, clock.now, "short")
    decode_started(b1, 200, 0.0, 0, "unbounded")  # no max_tokens: its gaps are unknown
    assert isinstance(chooser.place(Facts(price_tokens=1000, max_tokens=8)), Refusal)
    decode_ended(b1, 200, 0.0, clock.now, "unbounded")
    decode_started(b1, 200, 0.0, 1, "one-token")  # a single token has no gap to stretch
    assert placed(chooser.place(Facts(price_tokens=1000, max_tokens=8))).single


def test_a_stream_absorbs_overflow_prefills_only_while_its_budget_has_room() -> None:
    clock, chooser, _p0, b1 = _overflowing()
    decode_started(b1, 200, 0.1, 12, "s1")  # 11 x (0.05 - ~0.014) = ~0.39 s of room
    absorbed = []
    for k in range(5):
        p = chooser.place(Facts(price_tokens=1000, max_tokens=8))
        if not isinstance(p, Placement):
            break
        assert p.decode is b1
        # what the proxy books for the plain request: its prefill, then its own stream
        charge = prefill_started(b1, 1000, clock.now)
        decode_started(b1, 1000, 0.0, 8, f"local{k}")
        prefill_ended(b1, clock.now, charge)
        absorbed.append(b1.load.streams["s1"][1])
    # each local prefill stretched s1 by 0.11 s; the streams' room (spread priced in) held
    # two, not a third; the overflow requests' own streams never absorbed their own prefill
    assert absorbed == pytest.approx([0.11, 0.22])
    assert b1.load.streams["local1"][1] == 0.0 and b1.load.streams["local0"][1] == pytest.approx(0.11)
    decode_ended(b1, 200, 0.1, clock.now, "s1")
    assert "s1" not in b1.load.streams


def test_overflow_queues_behind_the_prefills_in_flight_on_that_engine() -> None:
    clock, chooser, _p0, b1 = _overflowing()
    prefill_started(b1, 1000, clock.now)  # 0.11 s queued: 0.11 + 0.11 + two steps fits 0.3
    first = placed(chooser.place(Facts(price_tokens=1000, max_tokens=8)))
    assert first.decode is b1 and first.predicted_ttft_s > 0.22
    prefill_started(b1, 1000, clock.now)  # 0.22 s queued: the next would answer past 0.3
    assert isinstance(chooser.place(Facts(price_tokens=1000, max_tokens=8)), Refusal)


def test_overflow_is_only_for_both_engines_and_tenants_within_their_share() -> None:
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")  # a fixed kv_consumer
    chooser = CurvePriced([p0, d0], ttft_s=0.3, tpot_s=0.05, clock=clock, overflow=True)
    for _ in range(3):
        prefill_started(p0, 1000, clock.now)
    assert isinstance(chooser.place(Facts(price_tokens=1000, max_tokens=8)), Refusal)
    clock, chooser, _p0, _b1 = _overflowing()
    chooser._inflight = {"a": 3, "b": 1}
    chooser._total = 4
    assert isinstance(chooser.place(Facts(price_tokens=1000, max_tokens=8, tenant="a")), Refusal)
    assert placed(chooser.place(Facts(price_tokens=1000, max_tokens=8, tenant="b"))).single


def test_overflow_keeps_the_tpot_budget_of_the_request_itself() -> None:
    _clock, chooser, _p0, b1 = _overflowing(tpot_s=0.012)
    # b1's step with one more stream: 0.01 + 0.002 + tokens > 0.012
    decode_started(b1, 200, 0.0, 12, "s1")
    assert isinstance(chooser.place(Facts(price_tokens=1000, max_tokens=8)), Refusal)


@settings(max_examples=300, deadline=None)
@given(running=st.integers(0, 12), reserved=st.integers(0, 12),
       departures=st.floats(0.0, 50.0), window=st.floats(0.0, 0.5),
       bias=st.floats(-0.02, 0.02), steps=st.integers(1, 512), tokens=st.integers(1, 4000))
def test_the_request_path_prices_a_step_as_the_shared_helper_does(
        running: int, reserved: int, departures: float, window: float, bias: float,
        steps: int, tokens: int) -> None:
    """Where streams cannot be projected, `_best_decode` prices a stream as `stream_step_s`
    does (the rule the overflow paths use too)."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=1.0, tpot_s=0.05, clock=clock)
    d0.load.projects = False
    for k in range(running):
        decode_started(d0, 300 + k, 0.05)
    for k in range(reserved):
        decode_reserved(d0, 200 + k, 0.1)
    d0.load.departures, d0.load.departed_at = departures, clock.now
    d0.load.tpot_error_s = bias
    arrivals = arrivals_per_step(steps)
    choice = chooser._best_decode(tokens, arrivals, (), steps=steps, window_s=window,
                                  now=clock.now)
    assert choice is not None and choice.own_s == -1.0
    assert (choice.after_s, choice.judged_s) == pytest.approx(
        stream_step_s(d0, tokens, arrivals, steps, window, clock.now, 0.05, True)[:2])


@settings(max_examples=300, deadline=None)
@given(running=st.integers(0, 12), reserved=st.integers(0, 12),
       bias=st.floats(-0.05, 0.05), steps=st.integers(1, 512), tokens=st.integers(1, 4000))
def test_a_step_is_judged_by_the_pricing_rules_bias_and_spread(
        running: int, reserved: int, bias: float, steps: int, tokens: int) -> None:
    """What the request path holds to the TPOT budget is the step plus pricing.py's bounded
    bias and `TPOT_SPREAD_Z` spreads of the arrivals landing in the stream's life (no
    departures counted out: the leg starts now)."""
    d0 = engine("d0", "decode")
    for k in range(running):
        decode_started(d0, 300 + k, 0.05)
    for k in range(reserved):
        decode_reserved(d0, 200 + k, 0.1)
    d0.load.tpot_error_s = bias
    arrivals = arrivals_per_step(steps)
    after, judged, _ = stream_step_s(d0, tokens, arrivals, steps, 0.0, 0.0, 0.05, True)
    assert d0.profile is not None
    landing = d0.load.arrival_rate + d0.load.reserved_arrivals + arrivals
    assert judged - after == pytest.approx(
        tpot_bias_s(bias, 0.05)
        + TPOT_SPREAD_Z * tpot_spread_s(arrival_s(d0.profile), landing, steps), abs=1e-12)


def _decode_full(overflow: bool = True) -> tuple[Clock, CurvePriced, Engine, Engine]:
    """b0 is a `both` engine the role controller put in the prefill pool; d1's step with one
    more stream is over the 0.02 s TPOT budget."""
    clock = Clock()
    b0, d1 = engine("b0", "both"), engine("d1", "decode")
    b0.serves_decode = False
    chooser = CurvePriced([b0, d1], ttft_s=0.5, tpot_s=0.02, clock=clock, overflow=overflow)
    for k in range(10):
        decode_started(d1, 100, 0.0, 64, f"s{k}")  # 0.01 + 0.011 > 0.02
    return clock, chooser, b0, d1


def test_a_request_no_decode_engine_can_take_in_time_decodes_on_a_prefill_pool_engine() -> None:
    _clock, chooser, b0, _d1 = _decode_full()
    p = placed(chooser.place(Facts(price_tokens=100, max_tokens=64)))
    assert p.single and p.decode is b0
    assert chooser.state()["overflow"] == {"to_decode_pool": 0, "to_prefill_pool": 1}
    assert chooser.refused_tpot == 0 and chooser.offered_requests == 1


def test_a_prefill_engine_busy_with_prefill_takes_no_overflow_stream() -> None:
    clock, chooser, b0, _d1 = _decode_full()
    for _ in range(100):  # 100 x 0.02 s booked over a 2 s time constant: a share of 1
        prefill_ended(b0, clock.now, prefill_started(b0, 100, clock.now))
    refusal = chooser.place(Facts(price_tokens=100, max_tokens=64))
    assert isinstance(refusal, Refusal) and refusal.over_tpot
    clock.now += 20.0  # the share decays: the stream fits again
    assert placed(chooser.place(Facts(price_tokens=100, max_tokens=64))).decode is b0


def test_streams_on_a_prefill_engine_lengthen_the_ttft_it_is_priced_at() -> None:
    clock = Clock()
    b0, d1 = engine("b0", "both"), engine("d1", "decode")
    b0.serves_decode = False
    chooser = CurvePriced([b0, d1], ttft_s=1.0, tpot_s=0.1, clock=clock)
    alone = placed(chooser.place(Facts(price_tokens=100, max_tokens=8))).predicted_ttft_s
    decode_started(b0, 1000, 0.0, 64, "overflow")
    # one decode step of that stream rides along with the prefill: 0.01 + 0.001 + 0.001
    carried = placed(chooser.place(Facts(price_tokens=100, max_tokens=8))).predicted_ttft_s
    assert carried == pytest.approx(alone + 0.012)


def test_without_the_planner_nothing_overflows() -> None:
    """The reactive controller reads pool loads that overflow would blur: off there."""
    _clock, chooser, _b0, _d1 = _decode_full(overflow=False)
    refusal = chooser.place(Facts(price_tokens=100, max_tokens=64))
    assert isinstance(refusal, Refusal) and refusal.over_tpot
    _clock, chooser, _p0, _b1 = _overflowing()
    chooser.overflow = False
    assert isinstance(chooser.place(Facts(price_tokens=1000, max_tokens=8)), Refusal)


def test_an_engine_new_to_the_prefill_pool_is_priced_at_the_pool_s_prefill_share() -> None:
    """b0 has no prefill history yet, but the pool was admitted 0.9 s of prefill a second
    (its even part: over the ceiling): no overflow stream there. Admitted 0.1 s/s in 0.1 s
    prefills, a 4-token stream has 3 gaps, too few to absorb one prefill whole."""
    clock, chooser, b0, _d1 = _decode_full()
    fresh = CurvePriced([b0, _d1], ttft_s=0.5, tpot_s=0.02, clock=clock, overflow=True)
    fresh._pool_prefill.work, fresh._pool_prefill.count, fresh._pool_prefill.at = 1.8, 18.0, clock.now
    refusal = fresh.place(Facts(price_tokens=1, max_tokens=64))
    assert isinstance(refusal, Refusal) and refusal.over_tpot
    chooser._pool_prefill.work, chooser._pool_prefill.count, chooser._pool_prefill.at = 0.2, 20.0, clock.now
    assert placed(chooser.place(Facts(price_tokens=1, max_tokens=64))).decode is b0
    chooser._pool_prefill.work, chooser._pool_prefill.count, chooser._pool_prefill.at = 0.2, 2.0, clock.now
    assert isinstance(chooser.place(Facts(price_tokens=1, max_tokens=4)), Refusal)


def _streaming(d0: Engine, key: str, steps: int, done: int, gap_s: float, now: float,
               tokens: int = 100) -> DecodeRelay:
    """Book a running stream of `steps` tokens on `d0` whose relay has streamed `done` of
    them, `gap_s` apart, the latest at `now`."""
    relay = DecodeRelay(lambda _r: None, 1.0, 1.0)
    relay.events, relay.t_last = done, now
    relay.t_first = now - (done - 1) * gap_s if done else 0.0
    decode_started(d0, tokens, 1 / steps, steps, key, relay)
    return relay


def _busy_decode(done: int, gap_s: float,
                 ttft_s: float = 1.0) -> tuple[Clock, CurvePriced, Engine]:
    """A prefill engine and a decode engine running thirteen streams of 40 tokens, `done` of
    each streamed `gap_s` apart (0.0243 s a step at the curve); TPOT budget 25 ms."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=ttft_s, tpot_s=0.025, clock=clock)
    for k in range(13):
        _streaming(d0, f"s{k}", 40, done, gap_s, clock.now)
    return clock, chooser, d0


def test_projected_admission_counts_out_the_streams_that_end_within_the_newcomers_life() -> None:
    """Thirteen streams step at 0.0243 s; a fourteenth makes it 0.0254 s, past a 0.025 s
    budget. When each of them has two tokens left the newcomer decodes alone after two steps,
    and every stream keeps the budget: admitted. When each has 38 left, every one of them
    would end past it: refused."""
    _clock, chooser, d0 = _busy_decode(38, 0.0243)
    placement = placed(chooser.place(Facts(max_tokens=40)))
    assert placement.decode is d0
    assert placement.predicted_tpot_s == pytest.approx(0.02542 + 0.0101 * 14 / 40)  # step now
    assert 0.0 < placement.projected_tpot_s < 0.02  # it runs nearly alone
    _clock, busy, _d1 = _busy_decode(2, 0.0243)
    refusal = busy.place(Facts(max_tokens=40))
    assert isinstance(refusal, Refusal) and refusal.over_tpot
    assert refusal.predicted_tpot_s > 0.025


def test_a_stream_already_lost_does_not_refuse_a_newcomer_but_one_inside_the_margin_does() -> None:
    """A stream whose gaps so far already put it past the budget loses it whatever comes, so
    it refuses nobody; one within the budget but not within the measured margin would be
    pushed past by more load, so it does."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=1.0, tpot_s=0.025, clock=clock)
    _streaming(d0, "late", 40, 35, 0.03, clock.now)  # 34 gaps of 30 ms, 5 steps to go
    assert placed(chooser.place(Facts(max_tokens=40))).decode is d0
    p1, d1 = engine("p1", "prefill"), engine("d1", "decode")
    tight = CurvePriced([p1, d1], ttft_s=0.045, tpot_s=0.025, clock=clock)  # no room to hold
    _streaming(d1, "edge", 40, 35, 0.0245, clock.now)  # 24.5 ms so far, 11.1 ms steps ahead
    assert placed(tight.place(Facts(max_tokens=40))).decode is d1
    d1.load.projection_error_s = 0.002  # the projection has run 2 ms short here
    refusal = tight.place(Facts(max_tokens=40))
    assert isinstance(refusal, Refusal) and refusal.over_tpot


def test_the_projection_learns_its_error_from_the_streams_that_end() -> None:
    """A placement commits what each stream there is now projected to end with; a stream that
    ends teaches the engine its observed - projected TPOT, and one of a few tokens (a few
    steps' noise) teaches nothing."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=1.0, tpot_s=0.05, clock=clock)
    _streaming(d0, "s0", 40, 10, 0.011, clock.now)
    before = d0.load.lives["s0"].projected
    placement = placed(chooser.place(Facts(max_tokens=40)))
    projected = d0.load.lives["s0"].projected
    assert before == 0.0 and projected > 0.011  # the newcomer slows it
    decode_ended(d0, 100, 1 / 40, clock.now, "s0", projected + 0.004)
    assert d0.load.projection_error_s == pytest.approx(0.004 / 32)
    assert d0.load.projection_error_dev_s == pytest.approx(0.004 / 16)
    decode_started(d0, 100, 1 / 8, 8, "short", None, False, placement.projected_tpot_s)
    decode_ended(d0, 100, 1 / 8, clock.now, "short", 0.04)
    assert d0.load.projection_error_s == pytest.approx(0.004 / 32)
    assert d0.state()["projection_error"] == {"mean_s": 0.000125, "deviation_s": 0.00025}


def test_a_stream_of_unknown_length_falls_back_to_the_step_now() -> None:
    """A stream booked without its length cannot be projected: the engine is judged on its
    step now, as the budget holds it, and the placement carries no projection."""
    clock = Clock()
    p0, d0 = engine("p0", "prefill"), engine("d0", "decode")
    chooser = CurvePriced([p0, d0], ttft_s=1.0, tpot_s=0.05, clock=clock)
    decode_started(d0, 100, 0.0, 0, "unknown")
    placement = placed(chooser.place(Facts(max_tokens=40)))
    assert placement.projected_tpot_s == 0.0
    tight = CurvePriced([p0, d0], ttft_s=1.0, tpot_s=0.0125, clock=clock)
    assert isinstance(tight.place(Facts(max_tokens=40)), Refusal)  # 0.0122 + landing's spread


def test_a_leg_that_would_push_streams_past_tpot_is_held_until_they_end_if_ttft_allows() -> None:
    """Thirteen streams at 24.8 ms a token so far, four tokens each to go: a newcomer now
    would push every one past a 25 ms budget. Held four steps, until they end, it joins
    none of them: placed with its leg sent then, its TTFT priced with the wait. With a TTFT
    budget that leaves no room for the wait it is refused."""
    clock, chooser, _d0 = _busy_decode(36, 0.0248)
    placement = placed(chooser.place(Facts(max_tokens=40)))
    step = 0.01 + 13 * 0.0011 + 0.00112  # the step now with the newcomer
    assert placement.decode_at == pytest.approx(clock.now + 4 * step)
    first_token = 1.5 * (step + 0.0101 * 14 / 40)
    assert placement.predicted_ttft_s == pytest.approx(4 * step + first_token)
    assert 0.0 < placement.projected_tpot_s < 0.012  # it decodes alone
    _clock, tight, _d1 = _busy_decode(36, 0.0248, ttft_s=0.1)
    refusal = tight.place(Facts(max_tokens=40))
    assert isinstance(refusal, Refusal) and refusal.over_tpot
