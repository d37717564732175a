"""Admission as a table: every combination of facts has a verdict, the order of the questions
is the policy, and every refusal the journal can show is built in one place."""

from __future__ import annotations

import pytest

from narwhal.core.outcomes import Outcome
from narwhal.serve.router.request import decisions as D
from narwhal.serve.router.scheduling.admission import (
    ADMIT,
    DECODE_POOL,
    FACT_BITS,
    OVER_FAIR,
    OVER_SHARE,
    OVER_TPOT,
    OVER_TTFT,
    OVERFLOW,
    PREFILL_POOL,
    PRESSED,
    Overflow,
    Refuse,
    admit,
    refusal,
)
from narwhal.serve.router.scheduling.engines import (
    REFUSAL_KINDS,
    REFUSED_CAPACITY,
    REFUSED_OVER_SHARE,
    REFUSED_TPOT,
)

# Over the TTFT budget is always over the part kept for tenants within their share.
TTFT = OVER_FAIR | OVER_TTFT
CASES = [
    (0, ADMIT),
    (OVERFLOW, ADMIT),
    (OVER_SHARE, ADMIT),  # a tenant's share matters only near capacity
    (OVER_FAIR, ADMIT),  # near capacity, within its share
    (OVER_FAIR | OVER_SHARE, Refuse(REFUSED_OVER_SHARE)),
    (OVER_FAIR | OVER_SHARE | OVER_TPOT, Refuse(REFUSED_OVER_SHARE)),  # share is asked first
    (OVER_FAIR | OVER_TPOT, Refuse(REFUSED_TPOT)),
    (TTFT, Refuse(REFUSED_CAPACITY)),
    (TTFT | OVER_SHARE, Refuse(REFUSED_CAPACITY)),  # over the budget: the share is moot
    (TTFT | OVER_TPOT, Refuse(REFUSED_CAPACITY)),  # TTFT is asked before TPOT
    (TTFT | OVERFLOW, Overflow(DECODE_POOL, Refuse(REFUSED_CAPACITY))),
    (TTFT | OVERFLOW | OVER_TPOT, Overflow(DECODE_POOL, Refuse(REFUSED_CAPACITY))),
    (TTFT | OVERFLOW | OVER_SHARE, Refuse(REFUSED_CAPACITY)),  # no overflow over share
    (OVER_TPOT, Refuse(REFUSED_TPOT)),
    (OVER_TPOT | OVERFLOW, Overflow(PREFILL_POOL, Refuse(REFUSED_TPOT))),
    (OVER_TPOT | OVERFLOW | OVER_SHARE, Refuse(REFUSED_TPOT)),
    (OVER_TPOT | OVER_FAIR | OVERFLOW, Overflow(PREFILL_POOL, Refuse(REFUSED_TPOT))),
]


@pytest.mark.parametrize(("facts", "verdict"), CASES)
def test_each_case_gets_the_policy_s_verdict(facts: int, verdict: object) -> None:
    assert admit(facts) == verdict


@pytest.mark.parametrize("facts", range(FACT_BITS))
def test_every_combination_has_a_verdict_and_the_share_is_read_only_under_pressure(
        facts: int) -> None:
    verdict = admit(facts)
    assert verdict is not None
    if not facts & PRESSED:  # the chooser does not count a tenant's share then
        assert admit(facts | OVER_SHARE) == admit(facts & ~OVER_SHARE) == ADMIT


def test_every_refusal_kind_settles_as_a_429_the_journal_names() -> None:
    outcomes = {kind: D.REFUSALS[kind].outcome for kind in REFUSAL_KINDS}
    assert outcomes == {REFUSED_CAPACITY: Outcome.REFUSED_CAPACITY,
                        REFUSED_OVER_SHARE: Outcome.REFUSED_OVER_SHARE,
                        REFUSED_TPOT: Outcome.REFUSED_TPOT}
    assert {D.REFUSALS[kind].status for kind in REFUSAL_KINDS} == {429}


def test_a_ttft_refusal_says_when_the_queue_will_have_drained() -> None:
    r = refusal(REFUSED_CAPACITY, "acme", 3.2, 1.0, 0.75, 0.01, 0.05)
    assert (r.kind, r.retry_after_s, r.ttft_budget_s) == (REFUSED_CAPACITY, 3, 1.0)
    assert r.detail == ("over capacity: predicted time to first token 3.20 s exceeds the 1 s "
                        "budget; retry after 3 s")
    assert not r.over_share and not r.over_tpot


def test_a_tenant_over_its_share_is_told_the_budget_kept_for_the_others() -> None:
    r = refusal(REFUSED_OVER_SHARE, "acme", 0.9, 1.0, 0.75, 0.01, 0.05)
    assert r.over_share and (r.retry_after_s, r.ttft_budget_s) == (1, 0.75)
    assert r.detail.startswith("near capacity and tenant 'acme' is over its fair share: "
                               "predicted time to first token 0.90 s exceeds the 0.75 s")


def test_a_tpot_refusal_names_the_step_it_predicted_and_retries_in_a_second() -> None:
    r = refusal(REFUSED_TPOT, None, 0.2, 1.0, 0.75, 0.0625, 0.05)
    assert r.over_tpot and r.retry_after_s == 1
    assert (r.predicted_tpot_s, r.tpot_budget_s) == (0.0625, 0.05)
    assert r.detail == ("over capacity: predicted time per output token 62.5 ms on the least "
                        "loaded decode engine exceeds the 50 ms budget; retry after 1 s")
