"""Curve-priced placement and predictive admission: the chooser used when a fleet has profiles.

Each engine is priced by its bound profile row (generation.py guarantees it is the live
process's row) and by the work this router already sent it, which the data path books here:
- prefill: a queue drain model. Every prefill dispatched to an engine (a prefill leg, or a
  plain request that prefills and decodes on one engine) pushes the engine's `busy_until` out
  by the prefill curve at that prompt length; when its last prefill in flight ends the queue is
  empty and `busy_until` snaps back to now. Predicted TTFT of a new request on an engine is
  `max(0, busy_until - now) + prefill_curve(n)`, the rule of `pricing.predicted_ttft_s`.
- decode: each decode leg adds one running request and its resident tokens (prompt + half its
  `max_tokens`, the mean over its life) until it ends. The decode engine is the one whose step
  time the request slows least while the step stays within the TPOT budget
  (`pricing.best_decode`'s rule); ties prefer the engine chosen for prefill (one plain
  request, no KV handoff), then the one with fewer running.
- admission: when even the best prefill engine's predicted TTFT exceeds `slo.ttft_s`, the
  request is refused (429) with `Retry-After` = whole seconds until that queue has drained
  enough (`pricing.retry_after_s`). Retries of a failed leg are never refused.
- fair shares: each tenant's share of the requests in flight is its weight over the weights
  of the tenants with requests in flight. Near capacity (predicted TTFT above
  `FAIR_BUDGET` x the budget) a tenant at or over its share is refused (429 `over_fair_share`),
  so the last part of the budget is kept for tenants within theirs: when the fleet is over
  capacity the tenant over its share is refused first. One tenant alone is never over share.

The loops below mirror pricing.py over live `Engine` objects instead of building seat
objects, so a placement allocates nothing but its result; tests/unit/serve check that both
agree. The TTFT prediction leaves out the KV handoff and first decode step (milliseconds next
to a prefill queue); the budget check is therefore slightly optimistic by that much.

Prompt length: the exact count arrives only with the prefill reply (or /tokenize, which needs
an engine first), so placement prices `Call.price_tokens`: the exact count when known, else
the request body's JSON size over the bytes per token learned from earlier replies
(token_estimate.py; 4 until the first reply, a token-id prompt counts its ids). A fixed 4 is
English BPE's average and underprices other tokenizers several times over.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from narwhal.serve.engines import Engine, Placement, Refusal, RequestFacts
from narwhal.serve.pricing import retry_after_s

FAIR_BUDGET = 0.75  # fraction of the TTFT budget a tenant over its fair share may use


def prefill_started(engine: Engine, tokens: int, now: float) -> None:
    """Book a prefill of `tokens` on the engine's queue."""
    profile = engine.profile
    cost = profile.prefill.seconds(tokens) if profile is not None else 0.0
    engine.busy_until = (engine.busy_until if engine.busy_until > now else now) + cost
    engine.prefill_pending += 1


def prefill_ended(engine: Engine, now: float) -> None:
    """A prefill finished (or failed); with none left in flight the queue is empty now."""
    engine.prefill_pending -= 1
    if engine.prefill_pending <= 0:
        engine.prefill_pending = 0
        if engine.busy_until > now:
            engine.busy_until = now


def decode_started(engine: Engine, resident_tokens: int) -> None:
    engine.running += 1
    engine.resident_tokens += resident_tokens


def decode_ended(engine: Engine, resident_tokens: int) -> None:
    engine.running -= 1
    engine.resident_tokens -= resident_tokens


def decode_step_s(engine: Engine) -> float:
    """Predicted decode step time with the legs this router runs there (0 without a curve)."""
    profile = engine.profile
    if profile is None:
        return 0.0
    c = profile.decode
    return c.base_s + c.per_token_s * engine.resident_tokens + c.per_request_s * engine.running


def decode_tokens(facts: RequestFacts) -> int:
    """Tokens the request keeps resident while it decodes, on average over its life."""
    mt = facts.max_tokens
    return facts.price_tokens + (mt >> 1 if mt else 0)


class CurvePriced:
    """The `EngineChooser` that prices placements on measured curves and admits by TTFT."""

    def __init__(self, engines: Sequence[Engine], ttft_s: float, tpot_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 weights: Mapping[str, float] | None = None) -> None:
        self._prefill = tuple(e for e in engines if e.spec.can_prefill)
        self._decode = tuple(e for e in engines if e.spec.can_decode)
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self._clock = clock
        self._turn = 0
        self.admitted = 0
        self.refused = 0
        self.refused_over_share = 0
        self.last_refusal: Refusal | None = None
        # Prefill seconds offered to the fleet, admitted or refused, priced at the best
        # engine's curve: the planner's measure of prefill demand (roles.py, planner.py).
        self.offered_prefill_s = 0.0
        self.fair_ttft_s = ttft_s * FAIR_BUDGET
        self._weights = dict(weights or {})
        self._inflight: dict[str | None, int] = {}  # admitted, unfinished, by tenant (>0 only)
        self._total = 0

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

    def _best_prefill(self, tokens: int, exclude: Sequence[Engine],
                      now: float) -> tuple[Engine | None, float]:
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
            c = profile.prefill
            queued = engine.busy_until - now
            t = ((queued if queued > 0.0 else 0.0) + c.a_s + c.b_s_per_token * tokens
                 + c.c_s_per_token2 * tokens * tokens)
            if t < best_s:
                best, best_s = engine, t
        return best, best_s

    def _best_decode(self, tokens: int, exclude: Sequence[Engine],
                     prefer: Engine | None = None) -> Engine | None:
        # One float key per engine, no tuples: within budget the key is the step-time increase
        # (the linear curve's closed form), over budget it is 1e9 + the resulting step time, so
        # any engine within budget beats every one over it (a step is at most 60 s).
        budget = self.tpot_s
        best: Engine | None = None
        best_key = math.inf
        best_running = 0
        for engine in self._decode:
            profile = engine.profile
            if (engine.ejected or engine.held or profile is None or not engine.serves_decode
                    or engine in exclude):
                continue
            c = profile.decode
            running = engine.running
            after = (c.base_s + c.per_token_s * (engine.resident_tokens + tokens)
                     + c.per_request_s * (running + 1))
            key = 1e9 + after if after > budget else c.per_token_s * tokens + c.per_request_s
            if key < best_key or (key == best_key and best is not prefer and (
                    engine is prefer or running < best_running)):
                best, best_key, best_running = engine, key, running
        return best

    def place(self, facts: RequestFacts) -> Placement | Refusal | None:
        self._turn += 1
        now = self._clock()
        prefill, predicted = self._best_prefill(facts.price_tokens, (), now)
        if prefill is None:
            return None
        queued = prefill.busy_until - now
        self.offered_prefill_s += predicted - (queued if queued > 0.0 else 0.0)
        tenant = facts.tenant
        if predicted > self.fair_ttft_s:
            if predicted > self.ttft_s:
                self.refused += 1
                refusal = Refusal(retry_after_s(predicted, self.ttft_s), predicted, self.ttft_s)
                self.last_refusal = refusal
                return refusal
            if self.over_share(tenant):
                self.refused_over_share += 1
                refusal = Refusal(retry_after_s(predicted, self.fair_ttft_s), predicted,
                                  self.fair_ttft_s, over_share=True)
                self.last_refusal = refusal
                return refusal
        decode = self._best_decode(decode_tokens(facts), (), prefer=prefill)
        if decode is None:
            return None
        self.admitted += 1
        self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
        self._total += 1
        return Placement(prefill, decode)

    def finished(self, facts: RequestFacts) -> None:
        tenant = facts.tenant
        left = self._inflight.get(tenant, 0) - 1
        if left > 0:
            self._inflight[tenant] = left
        else:
            self._inflight.pop(tenant, None)
        self._total = max(0, self._total - 1)

    def another_prefill(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._best_prefill(facts.price_tokens, exclude, self._clock())[0]

    def another_decode(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._best_decode(decode_tokens(facts), exclude)

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
            "last_refusal": None if last is None else {
                "predicted_ttft_s": round(last.predicted_ttft_s, 6),
                "retry_after_s": last.retry_after_s, "over_share": last.over_share},
            "inflight_by_tenant": {str(t): n for t, n in self._inflight.items()},
            "tenant_weights": self._weights,
            "prefill_queue_s": {e.id: round(max(0.0, e.busy_until - now), 6)
                                for e in self._prefill},
            "decode_step_s": {e.id: round(decode_step_s(e), 6) for e in self._decode},
        }
