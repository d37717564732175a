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
  budget. The proxy keeps a prefill line in front of each engine here (`PREFILL_LINE`): a
  prefill leg is sent only while the engine holds fewer than two, so no newcomer joins a
  batch (it waits in the router behind the prompts booked before it, as the queue model
  books it, and `waited_s` is 0).
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
- decode admission by projected lives (`projected_tpot_s`): a stream's TPOT is the mean of
  its gaps over its whole life, and most of the streams a newcomer meets end within its own,
  so the step now overstates what it will see. Each engine keeps every stream booked there
  (`Engine.lives`, `Engine.coming`: its length, its resident tokens, the relay that shows how
  many tokens it streamed and over how long), and a newcomer is admitted where no stream,
  itself included, would end past the TPOT budget with it, the steps ahead priced on the
  curve at the streams still running in each. The projection's own error is measured per
  engine (observed TPOT - the TPOT last projected for the stream) and its mean plus
  `PROJECTION_ERROR_Z` deviations is the margin held back. Where a stream cannot be
  projected (a length unknown), the step now is held to the budget instead, as below. At a
  fixed 2+2 split in the goodput bench's decode-heavy phase it admitted 862-868 requests
  within both budgets against 855-857 by the step now (two runs each, same session).
- holding a decode leg: when a split request's leg would push a stream past the budget now
  but streams there end while its TTFT budget still has room (the leg is sent, its first
  token comes a handoff later), it is admitted with its leg held until the first step at
  which every stream keeps the budget with it (`Placement.decode_at`; the proxy sends the
  leg then, its KV waiting on the prefill engine), and its TTFT is priced with the wait. A
  held leg's stream is booked from the step it is held to. An engine that takes a request
  at once is preferred to one that would hold it. Decode-heavy, same trace: 876-880 within
  both budgets against 862-868 without holding.
- admission: when even the best prefill engine's prediction exceeds `slo.ttft_s`, the request
  is refused (429) with `Retry-After` = whole seconds until that queue has drained enough
  (`pricing.retry_after_s`); when no decode engine keeps every stream within `slo.tpot_s`
  with it (projected as above, else its step now plus `pricing.TPOT_SPREAD_Z` spreads of the
  request's own TPOT over its `max_tokens` steps, `pricing.tpot_spread_s`), it is refused
  (429, `Retry-After: 1`, about a stream's life): admitted,
  it would miss its own budget and slow every stream already there past theirs. The decode
  work of every refused request, whichever budget refused it, still counts as demand for the
  pool planner (`refused_decode_*`): a request the prefill pool turned away is one the decode
  pool would have run had prefill had room, and leaving it out would make the decode pool look
  lighter exactly when prefill is short (the planner then moved an engine to prefill and paid
  for it in TPOT refusals). Retries of a failed leg are never refused.
- overflow (only under the pool planner, `overflow=True`): a request the prefill pool cannot
  serve within TTFT may run whole on a `both` engine of the decode pool, and a stream no
  decode engine can take within TPOT may decode on a `both` engine of the prefill pool, each
  when both budgets hold there (`_best_local`, `_best_home` say how they are priced).
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
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from narwhal.core.profiles import ProfileRow
from narwhal.serve.engines import Engine, Life, Placement, Refusal, RequestFacts
from narwhal.serve.pricing import (
    TPOT_SPREAD_Z,
    TTFT_MARGIN_CEILING,
    TTFT_MARGIN_FLOOR,
    arrivals_per_step,
    retry_after_s,
    ttft_error_seen,
    ttft_margin_s,
)
from narwhal.serve.relay import DecodeRelay

FAIR_BUDGET = 0.75  # fraction of the TTFT budget a tenant over its fair share may use
FIRST_TOKEN_STEPS = 1.5  # decode steps from a leg's arrival to its first token, on average
HANDOFF_WEIGHT = 0.1  # weight of the newest handoff in an engine's moving average
TPOT_ERROR_WEIGHT = 0.125  # weight of the newest stream's TPOT error in its engine's bias
# Time constant of each decode engine's measured departure rate (streams ended per second):
# a few stream lives on the bench, so a phase change is followed within seconds.
DEPARTURE_TAU_S = 5.0
# Time constant of each engine's measured prefill share (prefill seconds booked per second).
PREFILL_SHARE_TAU_S = 2.0
# A prefill engine busier than this with prefill takes no overflow stream: gaps stretched by
# 1 / (1 - share) grow without bound as the share nears one.
PREFILL_SHARE_CEILING = 0.8
# Prefill legs the router lets each engine of a curve-priced fleet hold at once: the one its
# running step computes and one waiting for the next step. The rest wait in the router, in
# the order placed (proxy.py), so each step computes one prompt. An engine runs every prompt
# waiting at it in its next step and answers them together when that step ends; the curves
# price each prompt alone, on which a batch of k computes nothing sooner and delays its first
# prompt by the other k - 1. Sent one at a time they answer one by one, as the queue model
# books them. Prefill-heavy goodput bench, fixed 2+2: 1210-1219 requests within both budgets
# (five runs) against 1172 with every leg sent when placed (narwhal-inference 0.7.0:
# 1172-1180).
PREFILL_LINE = 2
# Deviations of the projection's measured error that admission holds back (projection_margin_s).
PROJECTION_ERROR_Z = 3.0
# Weights of the newest stream in the projection error's moving mean and deviation: an engine
# ends tens of streams a second, and a margin that follows the last few swings by half a
# millisecond (the decode-heavy bench's deviation is 0.1-0.3 ms).
PROJECTION_ERROR_WEIGHT = 1 / 32
PROJECTION_DEV_WEIGHT = 1 / 16
# A stream of fewer gaps than this teaches the projection nothing: its TPOT is a few steps'
# noise (the prefill-heavy bench's 4-12 token streams strayed by 1.8 ms, 0.14 ms at 32-64).
PROJECTION_MIN_GAPS = 16


def prefill_started(engine: Engine, tokens: int, now: float) -> float:
    """Book a prefill of `tokens` on the engine's queue: alone in a new step when the engine
    has none in flight, else in the batch waiting behind the step running now. Returns the
    seconds booked, which `prefill_ended` takes back."""
    profile = engine.profile
    cost = profile.prefill.seconds(tokens) if profile is not None else 0.0
    if engine.prefill_pending <= 0:
        engine.busy_until = now + cost
        engine.waiting_since = math.inf
    else:
        busy = engine.busy_until
        engine.busy_until = (busy if busy > now else now) + cost
        if engine.waiting_since > now:
            engine.waiting_since = now
    engine.prefill_pending += 1
    engine.prefill_queued_s += cost
    if engine.tracks_streams:
        engine.prefill_work = engine.prefill_work * math.exp(
            (engine.prefill_done_at - now) / PREFILL_SHARE_TAU_S) + cost
        engine.prefill_done_at = now
        # every stream running here shares the step this prefill runs in (see _best_local)
        for stream in engine.streams.values():
            stream[1] += cost
    return cost


def prefill_repriced(engine: Engine, cost: float, tokens: int) -> float:
    """A prefill booked at `cost` seconds on its estimated prompt, now counted at `tokens`:
    the queue behind it moves by the difference. Returns the seconds booked now."""
    profile = engine.profile
    now_cost = profile.prefill.seconds(tokens) if profile is not None else 0.0
    delta = now_cost - cost
    if delta != 0.0 and engine.prefill_pending > 0:
        engine.busy_until += delta
        engine.prefill_queued_s += delta
        if engine.tracks_streams:
            _absorbed(engine, delta)
    return now_cost


def _absorbed(engine: Engine, seconds: float) -> None:
    """Move the prefill seconds the engine's running streams absorbed, and its prefill work,
    by `seconds` (a booking repriced, or taken back unsent), never below zero."""
    work = engine.prefill_work + seconds
    engine.prefill_work = work if work > 0.0 else 0.0
    for stream in engine.streams.values():
        absorbed = stream[1] + seconds
        stream[1] = absorbed if absorbed > 0.0 else 0.0


def prefill_ended(engine: Engine, now: float, cost: float, answered: bool = True) -> None:
    """A prefill booked at `cost` seconds answered (or failed). An answer marks the end of a
    real engine step: every prefill still in flight runs in the step that starts now, so the
    queue is re-anchored on the clock (the model's drift, either way, ends here); with none
    left in flight the queue is empty. Not `answered`: its leg was never sent (its request
    ended first), so the prefills behind it move up by its cost; that says nothing of the
    engine's steps, so the queue is not re-anchored, and nothing it was booked to delay was."""
    engine.prefill_pending -= 1
    if engine.prefill_pending <= 0:
        engine.prefill_pending = 0
        engine.prefill_queued_s = 0.0
        engine.busy_until = now
        engine.waiting_since = math.inf
    else:
        queued = engine.prefill_queued_s - cost
        queued = queued if queued > 0.0 else 0.0
        engine.prefill_queued_s = queued
        if answered:
            engine.busy_until = now + queued
            engine.waiting_since = math.inf
        else:
            engine.busy_until -= cost
    if not answered and engine.tracks_streams:
        _absorbed(engine, -cost)


def waited_s(engine: Engine, now: float) -> float:
    """How long the oldest prefill a newcomer would share its batch with has waited (0: the
    newcomer would wait alone, or run at once). Until an answer shows the running step has
    ended, the waiting ones still wait, however long the model thought that step would be.
    Behind a prefill line (`PREFILL_LINE`) a newcomer to the prefill pool joins no batch: it
    waits in the router until the prompts before it have run. (A plain request's prompt is
    sent with its decode leg, not through the line: on an engine of the decode pool, where
    every prompt is one, they still batch.)"""
    if engine.prefill_line and engine.serves_prefill:
        return 0.0
    since = engine.waiting_since
    return now - since if since < now else 0.0


def decode_reserved(engine: Engine, resident_tokens: int, arrivals: float,
                    whole: bool = False, key: object = None, since: float = 0.0,
                    steps: int = 0, start_at: float = 0.0) -> None:
    """A request placed with its decode on `engine`; its leg starts after the prefill (or,
    `whole`, a plain request: its prefill on `engine` too, not booked until it is sent).
    With a `key` (its request) and `since` (when it was received), an engine that tracks
    streams keeps a split one among the legs about to land there (`Engine.landing`); one that
    projects keeps it, `steps` tokens long (its max_tokens, 0: unknown), among those coming
    (`start_at`: when the router will send its leg, if it holds it)."""
    engine.reserved += 1
    engine.reserved_tokens += resident_tokens
    engine.reserved_arrivals += arrivals
    if key is not None and engine.projects:
        engine.coming[key] = Life(steps, resident_tokens, None, whole, 0.0, start_at)
    if whole:
        engine.whole_reserved += 1
    elif key is not None and engine.tracks_streams:
        engine.landing[key] = since


def decode_unreserved(engine: Engine, resident_tokens: int, arrivals: float,
                      whole: bool = False, key: object = None) -> None:
    if whole:
        engine.whole_reserved -= 1
    engine.reserved -= 1
    engine.reserved_tokens -= resident_tokens
    rate = engine.reserved_arrivals - arrivals
    engine.reserved_arrivals = rate if engine.reserved > 0 and rate > 1e-9 else 0.0
    if engine.landing:
        if key is not None:
            engine.landing.pop(key, None)
        if engine.reserved <= 0:
            engine.landing.clear()
    if engine.coming:
        if key is not None:
            engine.coming.pop(key, None)
        if engine.reserved <= 0:
            engine.coming.clear()


def decode_started(engine: Engine, resident_tokens: int, arrivals: float = 0.0,
                   steps: int = 0, key: object = None, relay: DecodeRelay | None = None,
                   plain: bool = False, projected: float = 0.0) -> None:
    """A decode leg started; with a `key` (its request) and `steps` (its max_tokens, 0:
    unknown), an engine that tracks streams (its chooser overflows) keeps it among those a
    prefill there would stretch, and one that projects keeps its life, read through `relay`
    as it streams (`plain`: it prefills there too; `projected`: its TPOT as admitted)."""
    if engine.projects and key is not None:
        engine.lives[key] = Life(steps, resident_tokens, relay, plain, projected)
    engine.running += 1
    engine.resident_tokens += resident_tokens
    engine.arrival_rate += arrivals
    if key is not None and steps != 1 and engine.tracks_streams:  # one token: no gap
        engine.streams[key] = [float(steps - 1 if steps > 1 else 0), 0.0]


def decode_ended(engine: Engine, resident_tokens: int, arrivals: float = 0.0,
                 now: float | None = None, key: object = None,
                 tpot_s: float | None = None) -> None:
    """A decode leg ended (or moved away): its load leaves, and the engine's decayed count of
    departures (`departures_per_s` reads it as a rate) takes one more. On an engine that
    projects, a stream that ended with an observed TPOT (`tpot_s`) teaches the projection's
    error: that TPOT less the one last projected for it."""
    t = time.monotonic() if now is None else now
    if engine.projects and key is not None:
        life = engine.lives.pop(key, None)
        if (life is not None and tpot_s is not None and life.projected > 0.0
                and life.steps > PROJECTION_MIN_GAPS):
            error = tpot_s - life.projected
            mean = engine.projection_error_s
            engine.projection_error_dev_s += PROJECTION_DEV_WEIGHT * (
                abs(error - mean) - engine.projection_error_dev_s)
            engine.projection_error_s = mean + PROJECTION_ERROR_WEIGHT * (error - mean)
    engine.running -= 1
    engine.resident_tokens -= resident_tokens
    rate = engine.arrival_rate - arrivals
    engine.arrival_rate = rate if engine.running > 0 and rate > 1e-9 else 0.0
    if key is not None:
        engine.streams.pop(key, None)
    if engine.running <= 0:
        engine.streams.clear()
        engine.lives.clear()
    engine.departures = engine.departures * math.exp(
        (engine.departed_at - t) / DEPARTURE_TAU_S) + 1.0
    engine.departed_at = t


def projection_margin_s(engine: Engine, budget: float) -> float:
    """What projected admission adds to a projected TPOT: the projection's measured error on
    this engine, its mean and `PROJECTION_ERROR_Z` deviations, bounded as `pricing.tpot_bias_s`
    bounds a bias."""
    margin = engine.projection_error_s + PROJECTION_ERROR_Z * engine.projection_error_dev_s
    low, high = TTFT_MARGIN_FLOOR * budget, TTFT_MARGIN_CEILING * budget
    return low if margin < low else high if margin > high else margin


def projected_tpot_s(engine: Engine, tokens: int, steps: int, plain: bool, now: float,
                     budget: float, window_s: float,
                     hold_limit_s: float = 0.0) -> tuple[float, float, float]:
    """Decode admission by the rest of each stream's life: (the worst TPOT any stream on the
    engine would end with if a newcomer of `tokens` resident tokens and `steps` tokens joined,
    plus the projection's margin (`projection_margin_s`); the newcomer's own projected TPOT, 0
    for a single token; when its leg starts, in seconds from now). Its leg starts `window_s`
    from now (its prefill), or, when that would push a stream past the budget, as late as
    `hold_limit_s` from now: the first step at which streams booked here end and every stream
    keeps the budget (the router then holds the leg until then). `plain`: it prefills there,
    no KV lands. (-1.0, 0.0, 0.0) when the engine's streams cannot be projected (one of
    unknown length, or booked without a life). Each stream's life keeps what it was
    projected with the newcomer (`Life.pending`, which `CurvePriced` commits when the
    newcomer is placed here).

    A stream's TPOT is the mean of its gaps between tokens, so what it ends with is the time
    its gaps took so far (from its relay) plus its remaining steps, over its gaps. The steps
    ahead are priced on the decode curve at the streams running in each: every stream booked
    here leaves after the tokens it has left, so the load falls as they end. A leg sent but
    without a first token lands at once, and the prefills queued here run at once; legs
    still reserved (their prefills run elsewhere) land while the newcomer's own prefill runs,
    so their arrivals are spread over the steps before it would start, and a held leg lands
    and starts at the step it is held to. Streams admitted later are not in it: each is
    admitted only if every stream here keeps the budget with it, so none is pushed past.

    The instantaneous rule (`_best_decode`'s step now plus spreads) holds a burst to the
    budget although most of the streams it meets end within the newcomer's life; this one
    counts them out as they end. A stream projected past the budget without the newcomer
    (the margin aside) does not refuse it: its budget is lost either way, and refusing would
    only lose another. One within the budget but not the margin does: more load would push
    it past."""
    profile = engine.profile
    if profile is None or steps < 1:
        return -1.0, 0.0, 0.0
    lives = engine.lives
    coming = engine.coming
    if len(lives) != engine.running or len(coming) != engine.reserved:
        return -1.0, 0.0, 0.0
    c = profile.decode
    base = c.base_s
    per_request = c.per_request_s
    per_token = c.per_token_s
    arrive = arrival_s(profile)
    mine = per_request + per_token * tokens
    landing = 0.0 if plain else arrive
    total = 0.0
    for life in lives.values():
        total += per_request + per_token * life.tokens
    for life in coming.values():
        total += per_request + per_token * life.tokens
    step_s = base + total + mine  # the step now with the newcomer: seconds to steps
    start = int(window_s / step_s) if window_s > 0.0 else 0
    queued = engine.busy_until - now
    # what lands at a step: (step, seconds); the prefills queued here run in the next one
    lumps: list[tuple[int, float]] = [(0, queued if queued > 0.0 else 0.0)]
    spread = 0.0  # seconds landing evenly over the `start` steps before the newcomer's
    # (first step, tokens left, load per step, seconds its gaps took, its gaps so far (-1:
    # not started), its place in `owners`)
    ahead: list[tuple[int, int, float, float, int, int]] = []
    owners: list[Life] = []
    changes: list[tuple[int, float]] = []  # (step, load it adds from then on; < 0: leaves)
    for life in lives.values():
        if life.steps <= 0:
            return -1.0, 0.0, 0.0
        relay = life.relay
        done = relay.events if relay is not None else 0
        left = life.steps - done
        if left <= 0:
            life.pending = 0.0
            continue
        w = per_request + per_token * life.tokens
        changes.append((0, w))
        changes.append((left, -w))
        if relay is not None and done >= 2 and relay.t_last > relay.t_first:
            ahead.append((0, left, w, relay.t_last - relay.t_first, done - 1, len(owners)))
        elif done >= 1:
            ahead.append((0, left, w, 0.0, 0, len(owners)))
        else:
            if not life.plain:
                lumps.append((0, arrive))
            ahead.append((0, left, w, 0.0, -1, len(owners)))
        owners.append(life)
    for life in coming.values():
        if life.steps <= 0:
            return -1.0, 0.0, 0.0
        w = per_request + per_token * life.tokens
        first = 0
        if life.start_at > now:  # held: it lands and starts then
            first = int((life.start_at - now) / step_s)
            lumps.append((first, arrive))
        else:
            spread += arrive if not life.plain else profile.prefill.seconds(life.tokens)
        changes.append((first, w))
        changes.append((first + life.steps, -w))
        ahead.append((first, life.steps, w, 0.0, -1, len(owners)))
        owners.append(life)
    # the steps ahead without the newcomer: at each step where the load changes, the
    # seconds of the steps before it and the load from it on
    changes.sort()
    lumps.sort()
    bounds: list[int] = []
    sums: list[float] = []
    loads: list[float] = []
    load = 0.0
    at = 0
    cum = 0.0
    for step, delta in changes:
        if step > at or not bounds:
            cum += (base + load) * (step - at)
            at = step
            bounds.append(at)
            sums.append(cum)
            loads.append(load)
        load += delta
        loads[-1] = load
    lump_steps: list[int] = []
    lump_sums: list[float] = []
    landed = 0.0
    for step, seconds in lumps:
        landed += seconds
        lump_steps.append(step)
        lump_sums.append(landed)
    margin = projection_margin_s(engine, budget)
    # the newcomer's first steps to try: `start`, then each step where streams end, up to
    # the hold limit
    limit = int(hold_limit_s / step_s) if hold_limit_s > window_s else start
    tries = [start]
    for step, delta in changes:
        if delta < 0.0 and start < step <= limit and step != tries[-1]:
            tries.append(step)
    worst = 0.0
    own = 0.0
    begin = start
    for begin in tries:
        worst, own = _project(ahead, owners, bounds, sums, loads, lump_steps, lump_sums,
                              base, spread, start, begin, steps, mine, landing, budget)
        if worst + margin <= budget:
            break
    if worst + margin > budget:  # none fits: what it would be at its own start
        begin = start
        worst, own = _project(ahead, owners, bounds, sums, loads, lump_steps, lump_sums,
                              base, spread, start, start, steps, mine, landing, budget)
    return worst + margin, own, (begin * step_s if begin > start else window_s)


def _project(ahead: list[tuple[int, int, float, float, int, int]], owners: list[Life],
             bounds: list[int], sums: list[float], loads: list[float], lump_steps: list[int],
             lump_sums: list[float], base: float, spread: float, start: int, begin: int,
             steps: int, mine: float, landing: float, budget: float) -> tuple[float, float]:
    """(the worst TPOT a stream keeping the budget without it would end with, the newcomer's
    own) with the newcomer's leg starting at step `begin` (`projected_tpot_s`); each life's
    `pending` takes its own."""
    end = begin + steps
    own = 0.0
    if steps > 1:  # its gaps: the steps after the one its first token comes in
        own = (_steps_s(bounds, sums, loads, lump_steps, lump_sums, base, spread, start, end)
               - _steps_s(bounds, sums, loads, lump_steps, lump_sums, base, spread, start,
                          begin + 1)
               + mine * (steps - 1)) / (steps - 1)
    worst = own
    for first, left, _, spent, gaps, owner in ahead:
        last = first + left
        ahead_s = _steps_s(bounds, sums, loads, lump_steps, lump_sums, base, spread, start,
                           last)
        if gaps < 0:  # not started: its gaps are the steps after its first
            if left < 2:
                owners[owner].pending = 0.0
                continue
            lo = first + 1
            first_s = _steps_s(bounds, sums, loads, lump_steps, lump_sums, base, spread, start,
                               lo)
            n = left - 1
            without = (ahead_s - first_s) / n
        else:
            lo = 0
            n = gaps + left
            without = (spent + ahead_s) / n
        overlap = (last if last < end else end) - (lo if lo > begin else begin)
        added = mine * overlap if overlap > 0 else 0.0
        if lo <= begin < last:
            added += landing
        tpot = without + added / n
        owners[owner].pending = tpot
        if tpot > worst and without <= budget:
            worst = tpot
    return worst, own


def _commit_projections(engine: Engine) -> None:
    """A request was placed on `engine` as projected: each stream there now expects the TPOT
    it was projected with it."""
    for life in engine.lives.values():
        if life.pending > 0.0:
            life.projected = life.pending
    for life in engine.coming.values():
        if life.pending > 0.0:
            life.projected = life.pending


def _steps_s(bounds: list[int], sums: list[float], loads: list[float], lump_steps: list[int],
             lump_sums: list[float], base: float, spread: float, start: int, x: int) -> float:
    """Seconds of the next `x` steps without the newcomer (`projected_tpot_s`): the curve at
    the streams running in each, what lands in them, and the part of `spread` landing within
    them (evenly over the `start` steps before the newcomer's own)."""
    k = bisect_right(bounds, x) - 1
    seconds = base * x if k < 0 else sums[k] + (base + loads[k]) * (x - bounds[k])
    k = bisect_right(lump_steps, x - 1) - 1
    if k >= 0:
        seconds += lump_sums[k]
    if spread > 0.0:
        seconds += spread if x >= start else spread * x / start
    return seconds


def departures_per_s(engine: Engine, now: float) -> float:
    """Decode legs ended per second on `engine`, exponentially weighted over
    `DEPARTURE_TAU_S` (0 until one ends)."""
    count = engine.departures
    if count <= 0.0:
        return 0.0
    return count * math.exp((engine.departed_at - now) / DEPARTURE_TAU_S) / DEPARTURE_TAU_S


def prefill_share(engine: Engine, now: float) -> float:
    """The share of the engine's time its booked prefills took, weighted over
    `PREFILL_SHARE_TAU_S` (0 until one is booked)."""
    work = engine.prefill_work
    if work <= 0.0:
        return 0.0
    return work * math.exp((engine.prefill_done_at - now) / PREFILL_SHARE_TAU_S) / PREFILL_SHARE_TAU_S


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


def stream_step_s(engine: Engine, tokens: int, arrivals: float, steps: int | None,
                  window_s: float, now: float, budget: float,
                  joining: bool) -> tuple[float, float]:
    """(the engine's decode step with a stream of `tokens` resident tokens landing `arrivals`
    legs per step added when `joining`, else the step now; that step as the TPOT budget
    holds it: plus the engine's bounded bias and `TPOT_SPREAD_Z` spreads over the stream's
    `steps`). The streams counted are those running and reserved, less those the measured
    departure rate ends within `window_s`. `CurvePriced._best_decode` inlines the same
    arithmetic on the request path; tests/unit/serve/test_scheduler.py holds the two equal."""
    profile = engine.profile
    if profile is None:
        return 0.0, 0.0
    c = profile.decode
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
    if streams <= 0.0 and not joining:
        return 0.0, 0.0
    resident = engine.resident_tokens * (1.0 - share) + engine.reserved_tokens
    rate = engine.arrival_rate * (1.0 - share) + engine.reserved_arrivals
    arrive = arrival_s(profile)
    extra = 1.0 if joining else 0.0
    mine = arrivals if joining else 0.0
    after = (c.base_s + c.per_token_s * (resident + tokens * extra)
             + c.per_request_s * (streams + extra) + arrive * (rate + mine))
    bias = engine.tpot_error_s
    low, high = TTFT_MARGIN_FLOOR * budget, TTFT_MARGIN_CEILING * budget
    judged = after + (low if bias < low else high if bias > high else bias)
    landing = rate + mine
    if steps and steps > 1 and landing > 0.0:
        judged += TPOT_SPREAD_Z * arrive * math.sqrt(landing / steps)
    return after, judged


class CurvePriced:
    """The `EngineChooser` that prices placements on measured curves and admits by TTFT."""

    def __init__(self, engines: Sequence[Engine], ttft_s: float, tpot_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 weights: Mapping[str, float] | None = None, overflow: bool = False) -> None:
        self._prefill = tuple(e for e in engines if e.spec.can_prefill)
        # May a request either pool cannot take run whole on a `both` engine of the other
        # (`_best_local`, `_best_home`)? Only under the pool planner (app.py says why).
        self.overflow = overflow
        for engine in engines:
            engine.tracks_streams = overflow
            engine.projects = True
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
        # Admitted as one plain request on an engine of the other pool (`both` engines under
        # role flips): the prefill pool could not meet TTFT (on a decode-pool engine), or no
        # decode engine could keep the TPOT budget (on a prefill-pool engine).
        self.overflow_to_decode_pool = 0
        self.overflow_to_prefill_pool = 0
        self.last_refusal: Refusal | None = None
        # Prefill seconds offered to the fleet, admitted or refused, priced at the best
        # engine's curve: the planner's measure of prefill demand (roles.py, planner.py).
        self.offered_prefill_s = 0.0
        # Decode work of refused requests, as the stream-seconds, resident-token-seconds and
        # landing-legs-per-step-seconds it would have held: demand the decode pool did not
        # serve (planner.py).
        # The prefill seconds admitted to the prefill pool and their count, decayed over
        # PREFILL_SHARE_TAU_S as of `_offered_at`: each prefill engine's even share of them
        # and their mean cost (`_best_home`). Admitted, not offered: a client that retries
        # every 429 at once would otherwise count its refusals as prefill the pool runs.
        self._offered_work = 0.0
        self._offered_count = 0.0
        self._offered_at = 0.0
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
        # the projected TPOT of the request `_best_decode` last chose an engine for (-1.0:
        # that engine's streams were not projected)
        self._projected_own = -1.0
        # when its leg should start, in seconds from placement (more than the window passed:
        # held until streams there end)
        self._decode_starts = 0.0

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
            if engine.running:  # overflow streams decode here: the step carries them too
                d = profile.decode
                t += (d.base_s + d.per_token_s * engine.resident_tokens
                      + d.per_request_s * engine.running)
            if t < best_s:
                best, best_s = engine, t
        return best, best_s

    def _best_decode(self, tokens: int, arrivals: float, exclude: Sequence[Engine],
                     prefer: Engine | None = None, steps: int | None = None,
                     window_s: float = 0.0, now: float = 0.0, hold: bool = False
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
        best_own = -1.0
        best_starts = window_s
        margin = self.ttft_margin_s
        ttft_limit = self.ttft_s - (margin if margin > 0.0 else 0.0)
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
            judged = -1.0
            own = 0.0
            starts = window_s
            if engine.projects and steps and now > 0.0:
                # a split leg may be held while TTFT allows: its first token comes a handoff
                # after it is sent
                limit = 0.0
                if hold and engine is not prefer:
                    limit = ttft_limit - first_token_s(engine, after, True)
                judged, own, starts = projected_tpot_s(engine, tokens, steps, engine is prefer,
                                                       now, budget, window_s, limit)
            projected = judged >= 0.0
            if not projected:  # the step now, as the budget holds it
                judged = after + bias
                if steps and steps > 1 and landing > 0.0:  # one token has no TPOT to stray
                    judged += TPOT_SPREAD_Z * arrive * math.sqrt(landing / steps)
            key = 1e9 + after if judged > budget else (
                c.per_token_s * tokens + c.per_request_s + arrive * mine)
            if starts > window_s and judged <= budget:  # held: after any engine that is not
                key = 1e8 + starts
            if key < best_key or (key == best_key and best is not prefer and (
                    engine is prefer or streams < best_running)):
                best, best_key, best_after, best_running = engine, key, after, streams
                best_judged = judged
                best_own = own if projected else -1.0
                best_starts = starts
        self._projected_own = best_own
        self._decode_starts = best_starts
        return best, best_after, best_judged

    def place(self, facts: RequestFacts) -> Placement | Refusal | None:
        self._turn += 1
        now = self._clock()
        tokens = facts.price_tokens
        prefill, predicted = self._best_prefill(tokens, (), now)
        if prefill is None or prefill.profile is None:
            return None
        work = prefill.profile.prefill.seconds(tokens)
        self.offered_prefill_s += work
        resident = decode_tokens(facts)
        arrivals = arrivals_per_step(facts.max_tokens)
        decode, step, judged = self._best_decode(resident, arrivals, (), prefer=prefill,
                                                 steps=facts.max_tokens, window_s=predicted,
                                                 now=now, hold=True)
        if decode is None:
            return None
        decode_at = 0.0
        if self._decode_starts > predicted:  # held until streams there end
            decode_at = now + self._decode_starts
            predicted = self._decode_starts
        if decode.prefill_pending > 0 and decode is not prefill:
            # an overflow request's prefill runs there (`_best_local`): a leg landing before
            # it ends gets its first token in the step after it
            late = decode.busy_until - now - predicted
            if late > 0.0:
                predicted += late
        predicted += first_token_s(decode, step, decode is not prefill)
        modelled = predicted
        predicted += self.ttft_margin_s
        tenant = facts.tenant
        if predicted > self.fair_ttft_s:
            if predicted > self.ttft_s:
                if self.overflow and not self.over_share(tenant):
                    local, local_ttft, local_step = self._best_local(
                        tokens, resident, facts.max_tokens, now)
                    if local is not None:
                        self.overflow_to_decode_pool += 1
                        self._admit(tenant)
                        return Placement(local, local, local_ttft, local_step)
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
            home: Engine | None = None
            if self.overflow and not self.over_share(tenant):
                home, home_ttft, home_step = self._best_home(tokens, resident, facts.max_tokens,
                                                             now)
            if home is not None:
                self.overflow_to_prefill_pool += 1
                self._admit(tenant)
                self._pool_prefill(work, now)
                return Placement(home, home, home_ttft, home_step)
            self.refused_tpot += 1
            self._refused_decode(facts, resident, arrivals, step)
            refusal = Refusal(1, predicted, self.ttft_s, over_tpot=True, predicted_tpot_s=judged,
                              tpot_budget_s=self.tpot_s)
            self.last_refusal = refusal
            return refusal
        self._admit(tenant)
        if self.overflow:
            self._pool_prefill(work, now)
        own = self._projected_own
        if own >= 0.0:
            _commit_projections(decode)
        return Placement(prefill, decode, modelled, step, own if own > 0.0 else 0.0, decode_at)

    def _pool_prefill(self, work: float, now: float) -> None:
        """An admitted prefill of `work` seconds goes to the prefill pool (`_best_home`)."""
        decay = math.exp((self._offered_at - now) / PREFILL_SHARE_TAU_S)
        self._offered_work = self._offered_work * decay + work
        self._offered_count = self._offered_count * decay + 1.0
        self._offered_at = now

    def _admit(self, tenant: str | None) -> None:
        self.admitted += 1
        self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
        self._total += 1

    def _best_home(self, tokens: int, resident: int, steps: int | None,
                   now: float) -> tuple[Engine | None, float, float]:
        """Overflow the other way: when every decode engine would miss the TPOT budget, a
        `both` engine serving the prefill pool may decode the request itself after its own
        prefill (one plain request), if both budgets hold. Returns (the engine or None, its
        modelled TTFT before the margin, its decode step with the request added).

        The stream shares that engine's steps with the prefills the pool sends it, so its gaps
        are the decode step stretched by the share of the engine's time prefill takes: the
        larger of the engine's own (`prefill_share`) and an even part of the prefill seconds
        admitted to the pool (an engine that just joined the pool has no history yet, but
        will get its part). Its TPOT is the step as the budget holds it / (1 - share), with
        room left for one more prefill of the mean admitted cost in a single gap (prefills
        come whole, not spread: a short stream cannot absorb one); the lowest wins. The
        prefills there wait one decode step longer per step while streams run
        (`_best_prefill` prices that)."""
        if not steps or steps < 2:
            return None, 0.0, 0.0  # a stream of unknown length, or one with no gap
        budget = self.tpot_s
        margin = self.ttft_margin_s
        limit = self.ttft_s - (margin if margin > 0.0 else 0.0)
        serving = 0
        for engine in self._prefill:
            if engine.serves_prefill and not engine.ejected and not engine.held:
                serving += 1
        admitted = self._offered_work * math.exp((self._offered_at - now) / PREFILL_SHARE_TAU_S)
        pool_share = admitted / PREFILL_SHARE_TAU_S / serving if serving else 0.0
        lump = self._offered_work / self._offered_count if self._offered_count > 0.0 else 0.0
        best: Engine | None = None
        best_tpot = math.inf
        best_ttft = 0.0
        best_step = 0.0
        for engine in self._prefill:
            profile = engine.profile
            if (engine.ejected or engine.held or profile is None or not engine.serves_prefill
                    or engine.serves_decode or not engine.spec.can_decode
                    or engine.whole_reserved > 0):
                continue
            share = prefill_share(engine, now)
            share = share if share > pool_share else pool_share
            if share >= PREFILL_SHARE_CEILING:
                continue
            after, judged = stream_step_s(engine, resident, 0.0, steps, 0.0, now, budget, True)
            tpot = judged / (1.0 - share)
            if tpot > budget or tpot >= best_tpot or (steps - 1) * (budget - tpot) < lump:
                continue
            queued = engine.busy_until - now
            ttft = ((queued if queued > 0.0 else 0.0) + waited_s(engine, now)
                    + profile.prefill.seconds(tokens) + after)
            if ttft <= limit:
                best, best_tpot, best_ttft, best_step = engine, tpot, ttft, after
        return best, best_ttft, best_step

    def _best_local(self, tokens: int, resident: int, steps: int | None,
                    now: float) -> tuple[Engine | None, float, float]:
        """Overflow: when no split placement meets the TTFT budget, a `both` engine serving
        the decode pool may prefill and decode the request itself (one plain request), if
        both budgets still hold. Returns (the engine or None, its modelled TTFT before the
        margin, its decode step with the request added).

        The prefill runs inside one of the engine's steps, so every stream running there
        gets one step longer by the prefill's cost, spread over its `max_tokens` - 1 gaps.
        It is allowed only when every running stream can still absorb that within its TPOT
        budget at the step priced with the newcomer (as `_best_decode` prices it): its gaps
        x (budget - that step), less the prefill seconds it absorbed already
        (`Engine.streams`; a stream of unknown length blocks it). Its TTFT is the step
        running when it arrives, the prefills queued there before it, then the step that
        carries its own prefill, held to the budget less the measured TTFT margin when that
        is positive (a margin learned on split requests never loosens it). A split request
        whose decode leg is reserved there gets its first token no sooner than this one if
        its KV lands while this prefill runs, so each must still meet the same bound then
        (`Engine.landing`, when each was received).

        An engine with a whole request placed but not yet sent (its prompt being counted)
        takes no other: that one's prefill and stream are not booked yet
        (`Engine.whole_reserved`), so a second would be priced as if they were not there."""
        budget = self.tpot_s
        margin = self.ttft_margin_s
        limit = self.ttft_s - (margin if margin > 0.0 else 0.0)
        best: Engine | None = None
        best_ttft = math.inf
        best_step = 0.0
        for engine in self._decode:
            profile = engine.profile
            if (engine.ejected or engine.held or profile is None or not engine.serves_decode
                    or engine.serves_prefill or not engine.spec.can_prefill
                    or engine.whole_reserved > 0):
                continue
            cost = profile.prefill.seconds(tokens)
            queued = engine.busy_until - now
            wait = (queued if queued > 0.0 else 0.0) + waited_s(engine, now)
            running_step, _ = stream_step_s(engine, 0, 0.0, None, 0.0, now, budget, False)
            after, judged = stream_step_s(engine, resident, 0.0, steps, wait + cost, now,
                                          budget, True)
            if judged > budget:
                continue
            room = budget - judged
            if any(gaps * room - absorbed < cost for gaps, absorbed in engine.streams.values()):
                continue
            ttft = running_step + wait + after + cost
            # a split leg landing here while this prefill runs gets its first token when
            # this request does: each reserved here must still meet TTFT then
            first = now + ttft - limit
            if any(since < first for since in engine.landing.values()):
                continue
            if ttft <= limit and ttft < best_ttft:
                best, best_ttft, best_step = engine, ttft, after
        return best, best_ttft, best_step

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
            "overflow": {"to_decode_pool": self.overflow_to_decode_pool,
                         "to_prefill_pool": self.overflow_to_prefill_pool},
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
