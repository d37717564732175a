"""Overflow between pools: a request one pool cannot serve within its budget, run whole on a
`both` engine of the other pool, when both budgets still hold there.

Only under the pool planner (app.py says why): role flips leave `both` engines serving one
pool at a time, and a request refused by its own pool may still fit on one of them.
- To the decode pool (`best_local`): when no split placement meets the TTFT budget, a `both`
  engine serving the decode pool may prefill and decode the request itself.
- To the prefill pool (`best_home`): when every decode engine would miss the TPOT budget, a
  `both` engine serving the prefill pool may decode the request after its own prefill.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from narwhal.serve.router.scheduling.bookings import PREFILL_SHARE_TAU_S, prefill_share
from narwhal.serve.router.scheduling.costs import stream_step_s, uncached_s, waited_s
from narwhal.serve.router.scheduling.engines import Engine

# A prefill engine busier than this with prefill takes no overflow stream: gaps stretched by
# 1 / (1 - share) grow without bound as the share nears one.
PREFILL_SHARE_CEILING = 0.8


class Choice:
    """An overflow engine and what it was priced at: its modelled TTFT before the margin, and
    its decode step with the request added."""

    __slots__ = ("engine", "step_s", "ttft_s")

    def __init__(self, engine: Engine, ttft_s: float, step_s: float) -> None:
        self.engine = engine
        self.ttft_s = ttft_s
        self.step_s = step_s


class PoolPrefill:
    """The prefill seconds admitted to the prefill pool and their count, decayed over
    PREFILL_SHARE_TAU_S as of `at`: each prefill engine's even share of them and their mean
    cost (`best_home`). Admitted, not offered: a client that retries every 429 at once would
    otherwise count its refusals as prefill the pool runs."""

    __slots__ = ("at", "count", "work")

    def __init__(self) -> None:
        self.work = 0.0
        self.count = 0.0
        self.at = 0.0

    def admitted(self, work: float, now: float) -> None:
        decay = math.exp((self.at - now) / PREFILL_SHARE_TAU_S)
        self.work = self.work * decay + work
        self.count = self.count * decay + 1.0
        self.at = now

    def share(self, now: float, serving: int) -> float:
        """Each of `serving` prefill engines' even share of the pool's prefill time."""
        if not serving:
            return 0.0
        admitted = self.work * math.exp((self.at - now) / PREFILL_SHARE_TAU_S)
        return admitted / PREFILL_SHARE_TAU_S / serving

    def mean_cost(self) -> float:
        return self.work / self.count if self.count > 0.0 else 0.0


def best_home(pool: Sequence[Engine], demand: PoolPrefill, tokens: int, resident: int,
              steps: int | None, now: float, tpot_budget_s: float,
              ttft_limit_s: float) -> Choice | None:
    """Overflow to the prefill pool: the `both` engine of `pool` (the prefill engines) that
    decodes the request after its own prefill (one plain request) at the lowest TPOT, if both
    budgets hold.

    The stream shares that engine's steps with the prefills the pool sends it, so its gaps
    are the decode step stretched by the share of the engine's time prefill takes: the
    larger of the engine's own (`prefill_share`) and an even part of the prefill seconds
    admitted to the pool (an engine that just joined the pool has no history yet, but
    will get its part). Its TPOT is the step as the budget holds it / (1 - share), with
    room left for one more prefill of the mean admitted cost in a single gap (prefills
    come whole, not spread: a short stream cannot absorb one). The prefills there wait one
    decode step longer per step while streams run (the chooser's prefill pricing counts it)."""
    if not steps or steps < 2:
        return None  # a stream of unknown length, or one with no gap
    serving = sum(1 for e in pool if e.serves_prefill and not e.ejected and not e.held)
    pool_share = demand.share(now, serving)
    lump = demand.mean_cost()
    best: Choice | None = None
    best_tpot = math.inf
    for engine in pool:
        profile = engine.profile
        if (engine.ejected or engine.held or profile is None or not engine.serves_prefill
                or engine.serves_decode or not engine.spec.can_decode
                or engine.load.whole_reserved > 0):
            continue
        share = prefill_share(engine, now)
        share = share if share > pool_share else pool_share
        if share >= PREFILL_SHARE_CEILING:
            continue
        after, judged, _ = stream_step_s(engine, resident, 0.0, steps, 0.0, now,
                                         tpot_budget_s, True)
        tpot = judged / (1.0 - share)
        if tpot > tpot_budget_s or tpot >= best_tpot or (steps - 1) * (tpot_budget_s - tpot) < lump:
            continue
        queued = engine.load.busy_until - now
        ttft = ((queued if queued > 0.0 else 0.0) + waited_s(engine, now)
                + profile.prefill.seconds(tokens) + after)
        if ttft <= ttft_limit_s:
            best, best_tpot = Choice(engine, ttft, after), tpot
    return best


def best_local(pool: Sequence[Engine], tokens: int, resident: int, steps: int | None,
               now: float, tpot_budget_s: float, ttft_limit_s: float,
               cached: Mapping[str, int] | None = None) -> Choice | None:
    """Overflow to the decode pool: the `both` engine of `pool` (the decode engines) that
    prefills and decodes the request itself (one plain request) with the lowest TTFT, if both
    budgets still hold.

    The prefill runs inside one of the engine's steps, so every stream running there gets
    one step longer by the prefill's cost, spread over its `max_tokens` - 1 gaps. It is
    allowed only when every running stream can still absorb that within its TPOT budget at
    the step priced with the newcomer: its gaps x (budget - that step), less the prefill
    seconds it absorbed already (`EngineLoad.streams`; a stream of unknown length blocks
    it). Its TTFT is the step running when it arrives, the prefills queued there before it,
    then the step that carries its own prefill. A split request whose decode leg is reserved
    there gets its first token no sooner than this one if its KV lands while this prefill
    runs, so each must still meet the same bound then (`EngineLoad.landing`).

    An engine with a whole request placed but not yet sent (its prompt being counted) takes
    no other: that one's prefill and stream are not booked yet, so a second would be priced
    as if they were not there.

    With `cached` (the scheduler's cache-local question), the candidates are the decode
    engines that hold part of the prompt, `decode` ones included (every engine of a fleet is
    kv_both: the role is the router's), each priced on the tokens it lacks."""
    best: Choice | None = None
    for engine in pool:
        profile = engine.profile
        load = engine.load
        held = cached.get(engine.spec.id, 0) if cached is not None else 0
        if (engine.ejected or engine.held or profile is None or not engine.serves_decode
                or engine.serves_prefill or load.whole_reserved > 0
                or (held <= 0 if cached is not None else not engine.spec.can_prefill)):
            continue
        cost = uncached_s(profile.prefill, tokens, held)
        queued = load.busy_until - now
        wait = (queued if queued > 0.0 else 0.0) + waited_s(engine, now)
        running_step, _, _ = stream_step_s(engine, 0, 0.0, None, 0.0, now, tpot_budget_s,
                                           False)
        after, judged, _ = stream_step_s(engine, resident, 0.0, steps, wait + cost, now,
                                      tpot_budget_s, True)
        if judged > tpot_budget_s:
            continue
        room = tpot_budget_s - judged
        if any(gaps * room - absorbed < cost for gaps, absorbed in load.streams.values()):
            continue
        ttft = running_step + wait + after + cost
        # a split leg landing here while this prefill runs gets its first token when this
        # request does: each reserved here must still meet TTFT then
        first = now + ttft - ttft_limit_s
        if any(since < first for since in load.landing.values()):
            continue
        if ttft <= ttft_limit_s and (best is None or ttft < best.ttft_s):
            best = Choice(engine, ttft, after)
    return best
