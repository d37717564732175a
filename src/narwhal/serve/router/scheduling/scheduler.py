"""Curve-priced placement and predictive admission: the chooser used when a fleet has profiles.

Each engine is priced by its bound profile row (generation.py guarantees it is the live
process's row) and by the work this router already sent it, which the chooser's `Bookings`
hold (bookings.py: the prefill queue model and the decode streams). The family, by job:
- `place` asks, for a request of `Call.price_tokens` prompt tokens (the exact count when
  known, else the body's size over the bytes per token learned so far, token_estimate.py):
  which prefill engine answers soonest (`_best_prefill`: its queue, the oldest prefill its
  batch would wait behind, costs.waited_s, and the prefill curve), and which decode engine
  the stream slows least while every stream there keeps the TPOT budget (`_best_decode`:
  projection.py where the streams there can be projected, else the step now as
  costs.stream_step_s holds it to the budget). Ties prefer the prefill engine itself (one
  plain request, no KV handoff), then the one with fewer streams.
- the TTFT it predicts is the prefill's, a held leg's wait, and the first token after the
  handoff (costs.first_token_s), plus the model's measured error: each request that ends
  with a first token and no retried leg reports observed - predicted TTFT, and later
  predictions carry its mean + half a deviation (`pricing.ttft_margin_s`).
- admission.py's table says what happens with that price: admit, refuse (which budget), or
  try the other pool under the pool planner (overflow.py). Fair shares: each tenant's share
  of the requests in flight is its weight over the weights of the tenants with requests in
  flight; near capacity (predicted TTFT above `FAIR_BUDGET` x the budget) a tenant at or over
  its share is refused first. One tenant alone is never over share.
- demand for the pool planner (roles.py, planner.py): the prefill seconds offered, admitted
  or refused, and the decode work of every refused request, whichever budget refused it: a
  request the prefill pool turned away is one the decode pool would have run had prefill had
  room, and leaving it out would make the decode pool look lighter exactly when prefill is
  short.
docs/router.md, "Scheduling on measured curves and predictive admission", has the rules'
measured effects.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from heapq import heappop
from typing import Any

from narwhal.serve.router.scheduling.admission import (
    DECODE_POOL,
    OVER_FAIR,
    OVER_SHARE,
    OVER_TPOT,
    OVER_TTFT,
    OVERFLOW,
    PRESSED,
    Admit,
    Overflow,
    admit,
    refusal,
)
from narwhal.serve.router.scheduling.bookings import Bookings, chooser_owns, decode_tokens
from narwhal.serve.router.scheduling.costs import (
    decode_step_s,
    first_token_s,
    stream_step_s,
    uncached_s,
    waited_s,
)
from narwhal.serve.router.scheduling.decode_rank import (
    Rank,
    decode_floors,
    decode_key,
    within_key,
)
from narwhal.serve.router.scheduling.engines import (
    REFUSED_OVER_SHARE,
    REFUSED_TPOT,
    Engine,
    Placement,
    Refusal,
    RequestFacts,
)
from narwhal.serve.router.scheduling.overflow import PoolPrefill, best_home, best_local
from narwhal.serve.router.scheduling.pricing import (
    arrivals_per_step,
    ttft_error_seen,
    ttft_margin_s,
)
from narwhal.serve.router.scheduling.projection import commit_projections, projected_tpot_s

FAIR_BUDGET = 0.75  # fraction of the TTFT budget a tenant over its fair share may use
# Prefill legs the router lets each engine of a curve-priced fleet hold at once: the one its
# running step computes and one waiting for the next step. The rest wait in the router, in
# the order placed (proxy.py), so each step computes one prompt. An engine runs every prompt
# waiting at it in its next step and answers them together when that step ends; the curves
# price each prompt alone, on which a batch of k computes nothing sooner and delays its first
# prompt by the other k - 1. Sent one at a time they answer one by one, as the queue model
# books them (docs/router.md, "The prefill line").
PREFILL_LINE = 2


class DecodeChoice:
    """The decode engine `_best_decode` chose and what it priced there: the step with the
    request added (`after`), that step as the TPOT budget judges it (projected or with its
    margins), the request's own projected TPOT (-1.0: not projected), when its leg starts
    in seconds from placement (past the window: held), and the streams it meets."""

    __slots__ = ("after_s", "engine", "judged_s", "own_s", "starts_s", "streams")

    def __init__(self, engine: Engine, after_s: float, judged_s: float, own_s: float,
                 starts_s: float, streams: float) -> None:
        self.engine = engine
        self.after_s = after_s
        self.judged_s = judged_s
        self.own_s = own_s
        self.starts_s = starts_s
        self.streams = streams


class CurvePriced:
    """The `EngineChooser` that prices placements on measured curves and admits by TTFT."""

    def __init__(self, engines: Sequence[Engine], ttft_s: float, tpot_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 weights: Mapping[str, float] | None = None, overflow: bool = False) -> None:
        self.bookings = Bookings()
        self._prefill = tuple(e for e in engines if e.spec.can_prefill)
        # May a request either pool cannot take run whole on a `both` engine of the other
        # (overflow.py)? Only under the pool planner (app.py says why).
        self.overflow = overflow
        for engine in engines:
            chooser_owns(engine, projects=True, tracks_streams=overflow)
            engine.prefill_line = PREFILL_LINE
        self._decode = tuple(e for e in engines if e.spec.can_decode)
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self._clock = clock
        self._turn = 0
        self.admitted = 0
        self.refused = 0
        self.refused_over_share = 0
        self.refused_tpot = 0
        # Admitted as one plain request on an engine of the other pool (overflow.py).
        self.overflow_to_decode_pool = 0
        self.overflow_to_prefill_pool = 0
        # Run whole on a decode engine because its prefix cache made that the sooner way.
        self.cache_local = 0
        self.last_refusal: Refusal | None = None
        # Prefill seconds offered to the fleet, admitted or refused, priced at the best
        # engine's curve: the planner's measure of prefill demand (roles.py, planner.py).
        self.offered_prefill_s = 0.0
        self._pool_prefill = PoolPrefill()  # admitted to the prefill pool (overflow.py)
        # Decode work of refused requests, as the stream-seconds, resident-token-seconds and
        # landing-legs-per-step-seconds it would have held: demand the decode pool did not
        # serve (planner.py).
        self.refused_decode_stream_s = 0.0
        self.refused_decode_token_s = 0.0
        self.refused_decode_arrival_s = 0.0
        self.fair_ttft_s = ttft_s * FAIR_BUDGET
        self._weights = dict(weights or {})
        self._inflight: dict[str | None, int] = {}  # admitted, unfinished, by tenant (>0 only)
        self._total = 0
        # observed - predicted TTFT, moving mean and deviation (pricing.ttft_error_seen)
        self.ttft_error_mean_s = 0.0
        self.ttft_error_dev_s = 0.0
        self.ttft_margin_s = 0.0

    @property
    def offered_requests(self) -> int:
        """Requests placement was asked for, whatever it answered: the planner's demand."""
        return self.admitted + self.refused + self.refused_over_share + self.refused_tpot

    def over_share(self, tenant: str | None) -> bool:
        """Would one more request put `tenant` above its weighted share of those in flight?"""
        inflight = self._inflight
        if not inflight or (len(inflight) == 1 and tenant in inflight):
            return False  # alone on the fleet: nobody to be fair to
        weights = self._weights
        mine = weights.get(tenant, 1.0) if tenant is not None else 1.0
        active = mine
        for other in inflight:
            if other != tenant:
                active += weights.get(other, 1.0) if other is not None else 1.0
        return inflight.get(tenant, 0) + 1 > mine / active * (self._total + 1)

    def _best_prefill(self, tokens: int, exclude: Sequence[Engine], now: float,
                      cached: Mapping[str, int] | None = None) -> tuple[Engine | None, float]:
        """(the prefill engine whose queue answers a prompt of `tokens` soonest, that TTFT
        before the handoff); ties rotate so equal engines share load. Each engine computes
        only what its prefix cache lacks (`uncached_s`)."""
        pool = self._prefill
        n = len(pool)
        start = self._turn % n if n else 0
        best: Engine | None = None
        best_s = math.inf
        for k in range(n):
            engine = pool[(start + k) % n]
            profile = engine.profile
            if (engine.ejected or engine.held or profile is None or not engine.serves_prefill
                    or engine in exclude):
                continue
            load = engine.load
            queued = load.busy_until - now
            held = cached.get(engine.spec.id, 0) if cached is not None else 0
            t = ((queued if queued > 0.0 else 0.0) + waited_s(engine, now)
                 + uncached_s(profile.prefill, tokens, held))
            if load.running:  # overflow streams decode here: the step carries them too
                d = profile.decode
                t += (d.base_s + d.per_token_s * load.resident_tokens
                      + d.per_request_s * load.running)
            if t < best_s:
                best, best_s = engine, t
        return best, best_s


    def _ttft_limit(self) -> float:
        """The TTFT a placement must model within: the budget less a positive model error (a
        margin learned on split requests never loosens it)."""
        margin = self.ttft_margin_s
        return self.ttft_s - (margin if margin > 0.0 else 0.0)

    def _best_decode(self, tokens: int, arrivals: float, exclude: Sequence[Engine],
                     prefer: Engine | None = None, steps: int | None = None,
                     window_s: float = 0.0, now: float = 0.0,
                     hold: bool = False) -> DecodeChoice | None:
        """The decode engine the request slows least while the step stays within the TPOT
        budget (`pricing.best_decode`'s rule), by decode_rank's rank: its key is the step-time
        increase within the budget, OVER_KEY + the resulting step over it (any engine within
        budget beats every one over it), HELD_KEY + its start when its leg would be held
        (after any engine that takes it at once). The leg starts `window_s` from `now` (its
        prefill); on `prefer` (the prefill engine) the request is plain: no KV arrives, its
        prefill is on the queue. Engines are priced in the order of their rank's floor, and
        none after the first floor above the best rank found (decode_rank.py says why that
        choice is the one pricing every engine would make)."""
        pool = self._decode
        best: DecodeChoice | None = None
        best_rank: Rank | None = None
        floors = decode_floors(pool, tokens, arrivals, exclude, prefer, window_s)
        while floors:
            floor = heappop(floors)
            if best_rank is not None and floor > best_rank:
                break
            position = floor[3]
            choice, key = self._price_decode(pool[position], tokens, arrivals, prefer, steps,
                                             window_s, now, hold)
            rank = (key, floor[1], choice.streams, position)
            if key < math.inf and (best_rank is None or rank < best_rank):
                best, best_rank = choice, rank
        return best

    def _price_decode(self, engine: Engine, tokens: int, arrivals: float,
                      prefer: Engine | None, steps: int | None, window_s: float, now: float,
                      hold: bool) -> tuple[DecodeChoice, float]:
        """(what the request would meet on decode engine `engine`, its key there): the step
        as costs.stream_step_s holds it to the budget, or, where the streams there can be
        projected, as projection.py projects them, a split leg held while TTFT allows."""
        budget = self.tpot_s
        profile = engine.profile
        assert profile is not None
        mine = 0.0 if engine is prefer else arrivals
        after, judged, streams = stream_step_s(engine, tokens, mine, steps, window_s, now,
                                               budget, True)
        own = -1.0
        starts = window_s
        if engine.load.projects and steps and now > 0.0:
            # a split leg may be held while TTFT allows: its first token comes a handoff
            # after it is sent
            limit = 0.0
            if hold and engine is not prefer:
                limit = self._ttft_limit() - first_token_s(engine, after, True)
            seen = projected_tpot_s(engine, tokens, steps, engine is prefer, now, budget,
                                    window_s, limit)
            if seen is not None:
                judged, own, starts = seen.worst_s, seen.own_s, seen.starts_s
        key = decode_key(within_key(profile, tokens, mine), after, judged, budget, starts,
                         window_s)
        return DecodeChoice(engine, after, judged, own, starts, streams), key

    def place(self, facts: RequestFacts) -> Placement | Refusal | None:
        self._turn += 1
        now = self._clock()
        tokens = facts.price_tokens
        cached = facts.cached
        prefill, window = self._best_prefill(tokens, (), now, cached)
        if prefill is None or prefill.profile is None:
            return None
        held = cached.get(prefill.spec.id, 0) if cached is not None else 0
        work = uncached_s(prefill.profile.prefill, tokens, held)
        self.offered_prefill_s += work
        resident = decode_tokens(tokens, facts.max_tokens)
        arrivals = arrivals_per_step(facts.max_tokens)
        choice = self._best_decode(resident, arrivals, (), prefer=prefill,
                                   steps=facts.max_tokens, window_s=window, now=now, hold=True)
        if choice is None:
            return None
        modelled, decode_at = self._first_token(prefill, choice, window, now)
        if cached and choice.engine is not prefill:
            local = self._cache_local(facts, cached, resident, now, modelled)
            if local is not None:
                return local
        predicted = modelled + self.ttft_margin_s
        verdict = admit(self._facts(facts.tenant, predicted, choice.judged_s))
        if isinstance(verdict, Admit):
            self._admit(facts.tenant)
            if self.overflow:
                self._pool_prefill.admitted(work, now)
            decode = choice.engine
            own = choice.own_s
            if own >= 0.0:
                commit_projections(decode)
            return Placement(prefill, decode, modelled, choice.after_s,
                             own if own > 0.0 else 0.0, decode_at, held)
        if isinstance(verdict, Overflow):
            placed = self._overflow(verdict.pool, facts, resident, work, now)
            if placed is not None:
                return placed
            verdict = verdict.otherwise
        return self._refuse(verdict.kind, facts, resident, arrivals, choice.after_s,
                            predicted, choice.judged_s)

    def _cache_local(self, facts: RequestFacts, cached: Mapping[str, int], resident: int,
                     now: float, split_s: float) -> Placement | None:
        """The request run whole on a decode engine whose prefix cache makes that sooner than
        the split priced at `split_s` (its prefill elsewhere, then the handoff), when admission
        takes it there. Priced as overflow.best_local prices a plain request, on the tokens
        that engine lacks; never a fixed share of cached tokens.

        Its prefill rides one of that engine's steps, so every stream there gets its next
        token that much later: the seconds it saves this request must exceed the seconds it
        costs those streams together (streams x its prefill), or the fleet loses more than the
        request gains. A short new turn on a conversation the engine holds passes; a long
        uncached prompt moved onto a busy decode engine does not."""
        tokens = facts.price_tokens
        local = best_local(self._decode, tokens, resident, facts.max_tokens, now,
                           self.tpot_s, self._ttft_limit(), cached)
        if local is None or local.ttft_s >= split_s:
            return None
        engine = local.engine
        load = engine.load
        assert engine.profile is not None
        stall = uncached_s(engine.profile.prefill, tokens, cached.get(engine.spec.id, 0))
        if split_s - local.ttft_s <= (load.running + load.reserved) * stall:
            return None
        verdict = admit(self._facts(facts.tenant, local.ttft_s + self.ttft_margin_s,
                                    local.step_s))
        if not isinstance(verdict, Admit):
            return None
        self._admit(facts.tenant)
        self.cache_local += 1
        return Placement(engine, engine, local.ttft_s, local.step_s,
                         cached_tokens=cached.get(engine.spec.id, 0), cache_local=True)

    def _first_token(self, prefill: Engine, choice: DecodeChoice, window: float,
                     now: float) -> tuple[float, float]:
        """(the modelled TTFT, before the margin; when the decode leg is sent, 0: when the
        prefill ends): the prefill, a held leg's wait, an overflow prefill on the decode
        engine the leg must wait behind, then the first token after the handoff."""
        decode = choice.engine
        predicted = window
        decode_at = 0.0
        if choice.starts_s > predicted:  # held until streams there end
            decode_at = now + choice.starts_s
            predicted = choice.starts_s
        if decode.load.prefill_pending > 0 and decode is not prefill:
            # an overflow request's prefill runs there: a leg landing before it ends gets
            # its first token in the step after it
            late = decode.load.busy_until - now - predicted
            if late > 0.0:
                predicted += late
        return predicted + first_token_s(decode, choice.after_s, decode is not prefill), decode_at

    def _facts(self, tenant: str | None, predicted_ttft: float, judged_tpot: float) -> int:
        """Admission's fact bits for a request priced at these predictions; its tenant's
        share is counted only where the table reads it."""
        facts = 0
        if predicted_ttft > self.ttft_s:
            facts |= OVER_TTFT
        if predicted_ttft > self.fair_ttft_s:
            facts |= OVER_FAIR
        if judged_tpot > self.tpot_s:
            facts |= OVER_TPOT
        if self.overflow:
            facts |= OVERFLOW
        if facts & PRESSED and self.over_share(tenant):
            facts |= OVER_SHARE
        return facts

    def _overflow(self, pool: str, facts: RequestFacts, resident: int, work: float,
                  now: float) -> Placement | None:
        """Run the request whole on a `both` engine of the other `pool`, if one holds both
        budgets (overflow.py)."""
        if pool == DECODE_POOL:
            local = best_local(self._decode, facts.price_tokens, resident, facts.max_tokens,
                               now, self.tpot_s, self._ttft_limit())
            if local is None:
                return None
            self.overflow_to_decode_pool += 1
            self._admit(facts.tenant)
            return Placement(local.engine, local.engine, local.ttft_s, local.step_s)
        home = best_home(self._prefill, self._pool_prefill, facts.price_tokens, resident,
                         facts.max_tokens, now, self.tpot_s, self._ttft_limit())
        if home is None:
            return None
        self.overflow_to_prefill_pool += 1
        self._admit(facts.tenant)
        self._pool_prefill.admitted(work, now)
        return Placement(home.engine, home.engine, home.ttft_s, home.step_s)

    def _refuse(self, kind: str, facts: RequestFacts, resident: int, arrivals: float,
                step: float, predicted: float, judged: float) -> Refusal:
        """Count and build the refusal of `kind`; its decode work still counts as demand."""
        if kind == REFUSED_OVER_SHARE:
            self.refused_over_share += 1
        elif kind == REFUSED_TPOT:
            self.refused_tpot += 1
        else:
            self.refused += 1
        self._refused_decode(facts, resident, arrivals, step)
        refused = refusal(kind, facts.tenant, predicted, self.ttft_s, self.fair_ttft_s, judged,
                          self.tpot_s)
        self.last_refusal = refused
        return refused

    def _admit(self, tenant: str | None) -> None:
        self.admitted += 1
        self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
        self._total += 1

    def _refused_decode(self, facts: RequestFacts, resident: int, arrivals: float,
                        step: float) -> None:
        """Count a refused request's decode work: its stream would have lasted `max_tokens`
        steps at the step it was priced at (never past the budget: admitted, it would run
        no slower), holding `resident` tokens and landing `arrivals` legs per step."""
        lasts = (facts.max_tokens or 1) * (step if step < self.tpot_s else self.tpot_s)
        self.refused_decode_stream_s += lasts
        self.refused_decode_token_s += lasts * resident
        self.refused_decode_arrival_s += lasts * arrivals

    def finished(self, facts: RequestFacts) -> None:
        tenant = facts.tenant
        left = self._inflight.get(tenant, 0) - 1
        if left > 0:
            self._inflight[tenant] = left
        else:
            self._inflight.pop(tenant, None)
        self._total = max(0, self._total - 1)
        placement = facts.placement
        error = facts.tpot_error_s
        if error is not None and placement is not None:
            self.bookings.tpot_seen(placement.decode, error)
        error = facts.ttft_error_s
        if error is not None:
            self.ttft_error_mean_s, self.ttft_error_dev_s = mean, dev = ttft_error_seen(
                self.ttft_error_mean_s, self.ttft_error_dev_s, error)
            self.ttft_margin_s = ttft_margin_s(mean, dev, self.ttft_s)

    def another_prefill(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._best_prefill(facts.price_tokens, exclude, self._clock())[0]

    def another_decode(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        choice = self._best_decode(decode_tokens(facts.price_tokens, facts.max_tokens),
                                   arrivals_per_step(facts.max_tokens), exclude)
        return choice.engine if choice is not None else None

    def state(self) -> dict[str, Any]:
        """For /narwhal/state: the policy, its budgets, admission counts and engine loads."""
        now = self._clock()
        last = self.last_refusal
        return {
            "policy": "curve_priced",
            "ttft_budget_s": self.ttft_s,
            "tpot_budget_s": self.tpot_s,
            "fair_share_budget_s": self.fair_ttft_s,
            "admitted": self.admitted,
            "refused": self.refused,
            "refused_over_share": self.refused_over_share,
            "refused_tpot": self.refused_tpot,
            "overflow": {"to_decode_pool": self.overflow_to_decode_pool,
                         "to_prefill_pool": self.overflow_to_prefill_pool},
            "cache_local": self.cache_local,
            "ttft_model_error": {"mean_s": round(self.ttft_error_mean_s, 6),
                                 "deviation_s": round(self.ttft_error_dev_s, 6),
                                 "margin_s": round(self.ttft_margin_s, 6)},
            "last_refusal": None if last is None else {
                "predicted_ttft_s": round(last.predicted_ttft_s, 6),
                "predicted_tpot_s": round(last.predicted_tpot_s, 6) if last.over_tpot else None,
                "retry_after_s": last.retry_after_s, "over_share": last.over_share,
                "over_tpot": last.over_tpot},
            "inflight_by_tenant": {str(t): n for t, n in self._inflight.items()},
            "tenant_weights": self._weights,
            "prefill_queue_s": {e.id: round(max(0.0, e.load.busy_until - now), 6)
                                for e in self._prefill},
            "decode_step_s": {e.id: round(decode_step_s(e), 6) for e in self._decode},
        }
