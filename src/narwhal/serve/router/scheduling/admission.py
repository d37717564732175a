"""Admission as a table: what the chooser does with a priced request, and every refusal it
can give.

Why a table: admission weighs five facts together (the TTFT prediction over the budget, over
the part of it kept for tenants within their share, the tenant over its share, the TPOT
prediction over its budget, and whether the chooser may overflow into the other pool), and
the order of the questions is the policy: near capacity a tenant over its share is refused
first, so the last part of the TTFT budget is kept for tenants within theirs; a request the
prefill pool cannot serve may run whole on a `both` engine of the decode pool, and a stream
no decode engine can take may decode on a `both` engine of the prefill pool, each only under
the pool planner and never for a tenant over its share. Each case is one row, looked up
without I/O or a clock, so a unit test walks every case (tests/unit/serve/test_admission.py);
the chooser only prices and carries out the verdict. Every `Refusal` is built here
(`refusal`), with the sentence the client reads, and decisions.REFUSALS names its journal
outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from narwhal.serve.router.request import decisions as D
from narwhal.serve.router.scheduling.engines import (
    REFUSAL_KINDS,
    REFUSED_CAPACITY,
    REFUSED_OVER_SHARE,
    REFUSED_TPOT,
    Refusal,
)
from narwhal.serve.router.scheduling.pricing import retry_after_s

# Facts (bits)
OVER_TTFT: Final = 1  # the predicted TTFT exceeds the budget
OVER_FAIR: Final = 2  # it exceeds the part of the budget kept for tenants within their share
OVER_SHARE: Final = 4  # one more request would put its tenant over its weighted share
OVER_TPOT: Final = 8  # no decode engine keeps the TPOT budget with it
OVERFLOW: Final = 16  # the chooser may overflow into the other pool (the pool planner runs)
FACT_BITS: Final = 32
# The bits that make the tenant's share matter: without them a request is admitted whatever
# its share, so the chooser need not count it.
PRESSED: Final = OVER_FAIR | OVER_TPOT

# Pools an overflow may run in
DECODE_POOL: Final = "decode"  # whole on a `both` engine of the decode pool (TTFT missed)
PREFILL_POOL: Final = "prefill"  # whole on a `both` engine of the prefill pool (TPOT missed)


@dataclass(frozen=True, slots=True)
class Admit:
    """Place it where priced."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse it; `kind` is a `Refusal.kind`."""

    kind: str


@dataclass(frozen=True, slots=True)
class Overflow:
    """Try it whole on a `both` engine of `pool`; refuse as `otherwise` if none holds both
    budgets."""

    pool: str
    otherwise: Refuse


Verdict = Admit | Refuse | Overflow


@dataclass(frozen=True, slots=True)
class Row:
    """The fact bits a row needs set (`need`) and needs clear (`clear`), and its verdict."""

    need: int
    clear: int
    verdict: Verdict


ADMIT: Final = Admit()
_CAPACITY = Refuse(REFUSED_CAPACITY)
_TPOT = Refuse(REFUSED_TPOT)
# First matching row wins.
ROWS: Final = (
    Row(OVER_FAIR | OVER_TTFT | OVERFLOW, OVER_SHARE, Overflow(DECODE_POOL, _CAPACITY)),
    Row(OVER_FAIR | OVER_TTFT, 0, _CAPACITY),
    Row(OVER_FAIR | OVER_SHARE, 0, Refuse(REFUSED_OVER_SHARE)),
    Row(OVER_TPOT | OVERFLOW, OVER_SHARE, Overflow(PREFILL_POOL, _TPOT)),
    Row(OVER_TPOT, 0, _TPOT),
    Row(0, 0, ADMIT),
)


def _lookup(facts: int) -> Verdict:
    for row in ROWS:
        if facts & row.need == row.need and not facts & row.clear:
            return row.verdict
    raise AssertionError(f"no admission row for facts {facts}")  # the last row matches all


VERDICTS: Final = tuple(_lookup(facts) for facts in range(FACT_BITS))


def admit(facts: int) -> Verdict:
    """The verdict for a priced request's facts (bits above)."""
    return VERDICTS[facts]


def _check_coverage() -> None:
    """Every row is the verdict for some facts, and every refusal kind the journal can show
    is produced by a row and has its settlement."""
    reached = {id(_lookup(facts)) for facts in range(FACT_BITS)}
    dead = [row for row in ROWS if id(row.verdict) not in reached]
    assert not dead, f"admission rows no facts reach: {dead}"
    kinds = {v.kind for v in VERDICTS if isinstance(v, Refuse)}
    kinds |= {v.otherwise.kind for v in VERDICTS if isinstance(v, Overflow)}
    assert kinds == set(REFUSAL_KINDS) == set(D.REFUSALS), (kinds, D.REFUSALS)


_check_coverage()


def refusal(kind: str, tenant: str | None, predicted_ttft_s: float, ttft_budget_s: float,
            fair_budget_s: float, predicted_tpot_s: float, tpot_budget_s: float) -> Refusal:
    """The refusal of `kind` for a request priced at these predictions: its Retry-After (the
    TTFT refusals: whole seconds until the queue has drained enough, pricing.retry_after_s;
    a TPOT refusal: 1, about a stream's life) and the sentence the client reads."""
    if kind == REFUSED_OVER_SHARE:
        retry = retry_after_s(predicted_ttft_s, fair_budget_s)
        message = (f"near capacity and tenant {tenant!r} is over its fair share: "
                   f"predicted time to first token {predicted_ttft_s:.2f} s exceeds "
                   f"the {fair_budget_s:g} s kept for tenants within their share")
        return Refusal(kind, retry, predicted_ttft_s, fair_budget_s,
                       detail=f"{message}; retry after {retry} s")
    if kind == REFUSED_TPOT:
        message = (f"over capacity: predicted time per output token "
                   f"{predicted_tpot_s * 1000:.1f} ms on the least loaded decode "
                   f"engine exceeds the {tpot_budget_s * 1000:g} ms budget")
        return Refusal(kind, 1, predicted_ttft_s, ttft_budget_s, predicted_tpot_s,
                       tpot_budget_s, f"{message}; retry after 1 s")
    retry = retry_after_s(predicted_ttft_s, ttft_budget_s)
    message = (f"over capacity: predicted time to first token {predicted_ttft_s:.2f} s "
               f"exceeds the {ttft_budget_s:g} s budget")
    return Refusal(kind, retry, predicted_ttft_s, ttft_budget_s,
                   detail=f"{message}; retry after {retry} s")
