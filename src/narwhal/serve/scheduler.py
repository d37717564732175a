"""Curve-priced placement and predictive admission: the chooser used when a fleet has profiles.

Each engine is priced by its bound profile row (generation.py guarantees it is the live
process's row) and by the work this router already sent it, which the data path books here:
- prefill: a queue drain model. Every prefill dispatched to an engine (a prefill leg, or a
  plain request that prefills and decodes on one engine) pushes the engine's `busy_until` out
  by the prefill curve at that prompt length; when its last prefill in flight ends the queue is
  empty and `busy_until` snaps back to now. An engine runs every waiting prefill in its next
  step, so those all answer at that step's end, and an answer is the one sign the router gets
  that a step ended: at each answer every prefill still in flight is taken to run in the step
  starting then, and `busy_until` is re-anchored to now + their booked seconds, so the
  model's drift from the engine (on the 2-core bench it ran slower than the curves) does not
  pile up. Prefills booked after that wait behind it; the engine keeps when the oldest of
  them came (`waiting_since`). A new request on an engine is priced by the worst TTFT in the
  batch it joins, `oldest wait + max(0, busy_until - now) + prefill_curve(n)`
  (`pricing.batch_ttft_s`): admitting it must not push a request admitted earlier past the
  budget.
- first token: after the prefill, the decode engine's first token takes the KV handoff: the
  pull, then about one and a half of its steps (the step running when the leg arrives, then
  the one that computes it). The engine's measured handoff (a moving average of what the
  journal records as `handoff_s`) is used when it is longer than the step model's; that
  allowance is added to the prefill prediction before it is held against the budget. (On
  the 2-core bench a handoff measured about 40 ms against 20 ms of modelled steps.)
- decode: each decode leg adds one running request, its resident tokens (prompt + half its
  `max_tokens`, the mean over its life) and its arrivals per step (1/max_tokens: each decode
  leg computes its last prompt token, at the prefill curve's constant, in a step every stream
  shares) until it ends. The streams counted are those running, plus those reserved (placed,
  prefilling), less those the engine's measured departure rate says end before the newcomer's
  leg starts (at most the reserved: in steady state as many end as start). The decode engine
  is the one whose step time the request slows least while the step stays within the TPOT
  budget (`pricing.best_decode`'s rule); ties prefer the engine chosen for prefill (one plain
  request, no KV handoff), then the one with fewer running.
- the model's error: each request that ends with a first token and no retried leg reports
  observed - predicted TTFT (`Call.ttft_error_s`); `finished` keeps their moving mean and
  deviation and every later prediction carries mean + half a deviation (`pricing.ttft_margin_s`,
  shown in /narwhal/state as `ttft_model_error`) before it meets the budget.
- the decode curve's bias: each stream that ends reports observed - predicted TPOT
  (`Call.tpot_error_s`) to its decode engine, which keeps their moving mean (`tpot_error_s`);
  the step held to the TPOT budget carries it (`pricing.tpot_bias_s`).
- admission: when even the best prefill engine's prediction exceeds `slo.ttft_s`, the request
  is refused (429) with `Retry-After` = whole seconds until that queue has drained enough
  (`pricing.retry_after_s`); when even the best decode engine would step slower than
  `slo.tpot_s` with it (its mean step plus `pricing.TPOT_SPREAD_Z` spreads of the request's
  own TPOT over its `max_tokens` steps, `pricing.tpot_spread_s`), it is refused (429,
  `Retry-After: 1`, about a stream's life): admitted,
  it would miss its own budget and slow every stream already there past theirs. The decode
  work of every refused request, whichever budget refused it, still counts as demand for the
  pool planner (`refused_decode_*`): a request the prefill pool turned away is one the decode
  pool would have run had prefill had room, and leaving it out would make the decode pool look
  lighter exactly when prefill is short (the planner then moved an engine to prefill and paid
  for it in TPOT refusals). Retries of a failed leg are never refused.
- fair shares: each tenant's share of the requests in flight is its weight over the weights
  of the tenants with requests in flight. Near capacity (predicted TTFT above
  `FAIR_BUDGET` x the budget) a tenant at or over its share is refused (429 `over_fair_share`),
  so the last part of the budget is kept for tenants within theirs: when the fleet is over
  capacity the tenant over its share is refused first. One tenant alone is never over share.

The loops below mirror pricing.py over live `Engine` objects instead of building seat
objects, so a placement allocates nothing but its result; tests/unit/serve check that both
agree.

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

from narwhal.core.profiles import ProfileRow
from narwhal.serve.engines import Engine, Placement, Refusal, RequestFacts
from narwhal.serve.pricing import (
    TPOT_SPREAD_Z,
    TTFT_MARGIN_CEILING,
    TTFT_MARGIN_FLOOR,
    arrivals_per_step,
    retry_after_s,
    ttft_error_seen,
    ttft_margin_s,
)

FAIR_BUDGET = 0.75  # fraction of the TTFT budget a tenant over its fair share may use
FIRST_TOKEN_STEPS = 1.5  # decode steps from a leg's arrival to its first token, on average
HANDOFF_WEIGHT = 0.1  # weight of the newest handoff in an engine's moving average
TPOT_ERROR_WEIGHT = 0.125  # weight of the newest stream's TPOT error in its engine's bias
# Time constant of each decode engine's measured departure rate (streams ended per second):
# a few stream lives on the bench, so a phase change is followed within seconds.
DEPARTURE_TAU_S = 5.0


def prefill_started(engine: Engine, tokens: int, now: float) -> float:
    """Book a prefill of `tokens` on the engine's queue: alone in a new step when the engine
    has none in flight, else in the batch waiting behind the step running now. Returns the
    seconds booked, which `prefill_ended` takes back."""
    profile = engine.profile
    cost = profile.prefill.seconds(tokens) if profile is not None else 0.0
    if engine.prefill_pending <= 0:
        engine.busy_until = engine.batch_end = now + cost
        engine.waiting_since = math.inf
    else:
        busy = engine.busy_until
        engine.busy_until = (busy if busy > now else now) + cost
        if engine.waiting_since > now:
            engine.waiting_since = now
    engine.prefill_pending += 1
    engine.prefill_queued_s += cost
    return cost


def prefill_ended(engine: Engine, now: float, cost: float) -> None:
    """A prefill booked at `cost` seconds answered (or failed). An answer marks the end of a
    real engine step: every prefill still in flight runs in the step that starts now, so the
    queue is re-anchored on the clock (the model's drift, either way, ends here); with none
    left in flight the queue is empty."""
    engine.prefill_pending -= 1
    engine.waiting_since = math.inf
    if engine.prefill_pending <= 0:
        engine.prefill_pending = 0
        engine.prefill_queued_s = 0.0
        engine.busy_until = engine.batch_end = now
        return
    queued = engine.prefill_queued_s - cost
    queued = queued if queued > 0.0 else 0.0
    engine.prefill_queued_s = queued
    engine.busy_until = engine.batch_end = now + queued


def waited_s(engine: Engine, now: float) -> float:
    """How long the oldest prefill a newcomer would share its batch with has waited (0: the
    newcomer would wait alone, or run at once). Until an answer shows the running step has
    ended, the waiting ones still wait, however long the model thought that step would be."""
    since = engine.waiting_since
    return now - since if since < now else 0.0


def decode_reserved(engine: Engine, resident_tokens: int, arrivals: float) -> None:
    """A request placed with its decode on `engine`; its leg starts after the prefill."""
    engine.reserved += 1
    engine.reserved_tokens += resident_tokens
    engine.reserved_arrivals += arrivals


def decode_unreserved(engine: Engine, resident_tokens: int, arrivals: float) -> None:
    engine.reserved -= 1
    engine.reserved_tokens -= resident_tokens
    rate = engine.reserved_arrivals - arrivals
    engine.reserved_arrivals = rate if engine.reserved > 0 and rate > 1e-9 else 0.0


def decode_started(engine: Engine, resident_tokens: int, arrivals: float = 0.0) -> None:
    engine.running += 1
    engine.resident_tokens += resident_tokens
    engine.arrival_rate += arrivals


def decode_ended(engine: Engine, resident_tokens: int, arrivals: float = 0.0,
                 now: float | None = None) -> None:
    """A decode leg ended (or moved away): its load leaves, and the engine's decayed count of
    departures (`departures_per_s` reads it as a rate) takes one more."""
    engine.running -= 1
    engine.resident_tokens -= resident_tokens
    rate = engine.arrival_rate - arrivals
    engine.arrival_rate = rate if engine.running > 0 and rate > 1e-9 else 0.0
    t = time.monotonic() if now is None else now
    engine.departures = engine.departures * math.exp(
        (engine.departed_at - t) / DEPARTURE_TAU_S) + 1.0
    engine.departed_at = t


def departures_per_s(engine: Engine, now: float) -> float:
    """Decode legs ended per second on `engine`, exponentially weighted over
    `DEPARTURE_TAU_S` (0 until one ends)."""
    count = engine.departures
    if count <= 0.0:
        return 0.0
    return count * math.exp((engine.departed_at - now) / DEPARTURE_TAU_S) / DEPARTURE_TAU_S


def handoff_seen(engine: Engine, seconds: float) -> None:
    """A split request's first token came `seconds` after its prefill reply."""
    last = engine.handoff_s
    engine.handoff_s = seconds if last == 0.0 else last + HANDOFF_WEIGHT * (seconds - last)


def first_token_s(engine: Engine, step_s: float, split: bool) -> float:
    """Seconds from the prefill's end to the first token on decode engine `engine`: the
    measured handoff when there is one, never less than the step model's one and a half
    steps; a plain request's first token comes with its prefill's step."""
    if not split:
        return step_s
    modelled = FIRST_TOKEN_STEPS * step_s
    return engine.handoff_s if engine.handoff_s > modelled else modelled


def arrival_s(profile: ProfileRow) -> float:
    """What one decode leg arriving with pulled KV adds to the step it arrives in: its last
    prompt token computed as a first prefill chunk (the curve's constant and one token)."""
    c = profile.prefill
    return c.a_s + c.b_s_per_token


def decode_step_s(engine: Engine) -> float:
    """Predicted decode step time with the legs this router runs and has placed there (0
    without a curve); see `_best_decode` for how reserved legs count."""
    profile = engine.profile
    if profile is None:
        return 0.0
    c = profile.decode
    running = max(engine.running, engine.reserved)
    tokens = max(engine.resident_tokens, engine.reserved_tokens)
    arrivals = max(engine.arrival_rate, engine.reserved_arrivals)
    return (c.base_s + c.per_token_s * tokens + c.per_request_s * running
            + arrival_s(profile) * arrivals)


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
        self.refused_tpot = 0
        self.last_refusal: Refusal | None = None
        # Prefill seconds offered to the fleet, admitted or refused, priced at the best
        # engine's curve: the planner's measure of prefill demand (roles.py, planner.py).
        self.offered_prefill_s = 0.0
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
            t = ((queued if queued > 0.0 else 0.0) + waited_s(engine, now) + c.a_s
                 + c.b_s_per_token * tokens + c.c_s_per_token2 * tokens * tokens)
            if t < best_s:
                best, best_s = engine, t
        return best, best_s

    def _best_decode(self, tokens: int, arrivals: float, exclude: Sequence[Engine],
                     prefer: Engine | None = None, steps: int | None = None,
                     window_s: float = 0.0, now: float = 0.0
                     ) -> tuple[Engine | None, float, float]:
        """(the engine, its step time with the request added, that plus `TPOT_SPREAD_Z` of
        the request's own TPOT spreads over its `steps`, which is what the budget holds);
        see `pricing.best_decode`. The leg starts `window_s` from `now` (its prefill)."""
        # One float key per engine, no tuples: within budget the key is the step-time increase
        # (the linear curve's closed form), over budget it is 1e9 + the resulting step time, so
        # any engine within budget beats every one over it (a step is at most 60 s).
        budget = self.tpot_s
        bias_low = TTFT_MARGIN_FLOOR * budget
        bias_high = TTFT_MARGIN_CEILING * budget
        best: Engine | None = None
        best_key = math.inf
        best_after = math.inf
        best_judged = math.inf
        best_running = 0.0
        for engine in self._decode:
            profile = engine.profile
            if (engine.ejected or engine.held or profile is None or not engine.serves_decode
                    or engine in exclude):
                continue
            c = profile.decode
            # The streams running when this one starts: those decoding now and the reserved
            # ones (their prefills run; each starts before this one), less the ones that end
            # meanwhile, which the engine's measured departure rate over the window counts
            # (never more than the reserved: in steady state as many end as start, and a
            # stream known to run on is not assumed gone). A burst that meets streams just
            # started counts them all, so it cannot over-admit before any has ended.
            running = engine.running
            reserved = engine.reserved
            share = 0.0
            ending = 0.0
            if reserved > 0 and running > 0 and window_s > 0.0:
                ending = departures_per_s(engine, now) * window_s
                cap = reserved if reserved < running else running
                if ending > cap:
                    ending = float(cap)
                share = ending / running
            streams = running + reserved - ending
            resident = engine.resident_tokens * (1.0 - share) + engine.reserved_tokens
            rate = engine.arrival_rate * (1.0 - share) + engine.reserved_arrivals
            arrive = arrival_s(profile)
            # On the prefill engine itself the request is plain: no KV arrives, its prefill
            # is on the queue instead.
            mine = 0.0 if engine is prefer else arrivals
            after = (c.base_s + c.per_token_s * (resident + tokens)
                     + c.per_request_s * (streams + 1.0) + arrive * (rate + mine))
            # the engine's measured bias, bounded as pricing.tpot_bias_s bounds it (inlined:
            # pricing.py is interpreted and this loop runs per engine per request)
            bias = engine.tpot_error_s
            if bias < bias_low:
                bias = bias_low
            elif bias > bias_high:
                bias = bias_high
            # pricing.tpot_spread_s, inlined for the same reason
            landing = rate + mine
            judged = after + bias
            if steps and landing > 0.0:
                judged += TPOT_SPREAD_Z * arrive * math.sqrt(landing / steps)
            key = 1e9 + after if judged > budget else (
                c.per_token_s * tokens + c.per_request_s + arrive * mine)
            if key < best_key or (key == best_key and best is not prefer and (
                    engine is prefer or streams < best_running)):
                best, best_key, best_after, best_running = engine, key, after, streams
                best_judged = judged
        return best, best_after, best_judged

    def place(self, facts: RequestFacts) -> Placement | Refusal | None:
        self._turn += 1
        now = self._clock()
        tokens = facts.price_tokens
        prefill, predicted = self._best_prefill(tokens, (), now)
        if prefill is None or prefill.profile is None:
            return None
        self.offered_prefill_s += prefill.profile.prefill.seconds(tokens)
        resident = decode_tokens(facts)
        arrivals = arrivals_per_step(facts.max_tokens)
        decode, step, judged = self._best_decode(resident, arrivals, (), prefer=prefill,
                                                 steps=facts.max_tokens, window_s=predicted,
                                                 now=now)
        if decode is None:
            return None
        predicted += first_token_s(decode, step, decode is not prefill)
        modelled = predicted
        predicted += self.ttft_margin_s
        tenant = facts.tenant
        if predicted > self.fair_ttft_s:
            if predicted > self.ttft_s:
                self.refused += 1
                self._refused_decode(facts, resident, arrivals, step)
                refusal = Refusal(retry_after_s(predicted, self.ttft_s), predicted, self.ttft_s)
                self.last_refusal = refusal
                return refusal
            if self.over_share(tenant):
                self.refused_over_share += 1
                self._refused_decode(facts, resident, arrivals, step)
                refusal = Refusal(retry_after_s(predicted, self.fair_ttft_s), predicted,
                                  self.fair_ttft_s, over_share=True)
                self.last_refusal = refusal
                return refusal
        if judged > self.tpot_s:
            self.refused_tpot += 1
            self._refused_decode(facts, resident, arrivals, step)
            refusal = Refusal(1, predicted, self.ttft_s, over_tpot=True, predicted_tpot_s=judged,
                              tpot_budget_s=self.tpot_s)
            self.last_refusal = refusal
            return refusal
        self.admitted += 1
        self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
        self._total += 1
        return Placement(prefill, decode, modelled, step)

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
            engine = placement.decode
            engine.tpot_error_s += TPOT_ERROR_WEIGHT * (error - engine.tpot_error_s)
        error = facts.ttft_error_s
        if error is not None:
            self.ttft_error_mean_s, self.ttft_error_dev_s = mean, dev = ttft_error_seen(
                self.ttft_error_mean_s, self.ttft_error_dev_s, error)
            self.ttft_margin_s = ttft_margin_s(mean, dev, self.ttft_s)

    def another_prefill(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._best_prefill(facts.price_tokens, exclude, self._clock())[0]

    def another_decode(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._best_decode(decode_tokens(facts), arrivals_per_step(facts.max_tokens),
                                 exclude)[0]

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
            "prefill_queue_s": {e.id: round(max(0.0, e.busy_until - now), 6)
                                for e in self._prefill},
            "decode_step_s": {e.id: round(decode_step_s(e), 6) for e in self._decode},
        }
