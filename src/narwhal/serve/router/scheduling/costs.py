"""What one engine's steps cost now: its bound profile's curves read at the load booked there.

These are the readings every part of the scheduling family shares (the chooser, overflow,
projection, the role controller): kept in one module so each is computed one way. They mirror
pricing.py's seat functions over live `Engine` objects, so a placement builds no seats;
tests/unit/serve/test_scheduler.py holds the two equal.
"""

from __future__ import annotations

import math

from narwhal.core.profiles import PrefillCurve, ProfileRow
from narwhal.serve.router.scheduling.bookings import departures_per_s
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.scheduling.pricing import (
    TPOT_SPREAD_Z,
    TTFT_MARGIN_CEILING,
    TTFT_MARGIN_FLOOR,
)

# Decode steps from a leg's arrival to its first token, on average: the step running when it
# arrives, then the one that computes it.
FIRST_TOKEN_STEPS = 1.5


def arrival_s(profile: ProfileRow) -> float:
    """What one decode leg arriving with pulled KV adds to the step it arrives in: its last
    prompt token computed as a first prefill chunk (the curve's constant and one token)."""
    c = profile.prefill
    return c.a_s + c.b_s_per_token


def uncached_s(curve: PrefillCurve, tokens: int, held: int) -> float:
    """The prefill of a `tokens` prompt whose first `held` tokens the engine's prefix cache
    holds: the curve's constant, its linear term on the tokens computed, and its quadratic
    (attention) term on those tokens attending to the whole prompt so far, t^2 - held^2."""
    if held <= 0:
        return curve.a_s + curve.b_s_per_token * tokens + curve.c_s_per_token2 * tokens * tokens
    if held >= tokens:
        held = tokens - 1 if tokens > 0 else 0
    return (curve.a_s + curve.b_s_per_token * (tokens - held)
            + curve.c_s_per_token2 * (tokens * tokens - held * held))


def waited_s(engine: Engine, now: float) -> float:
    """How long the oldest prefill a newcomer would share its batch with has waited (0: the
    newcomer would wait alone, or run at once). Until an answer shows the running step has
    ended, the waiting ones still wait, however long the model thought that step would be.
    Behind a prefill line (scheduler.PREFILL_LINE) a newcomer to the prefill pool joins no
    batch: it waits in the router until the prompts before it have run. (A plain request's
    prompt is sent with its decode leg, not through the line: on an engine of the decode
    pool, where every prompt is one, they still batch.)"""
    if engine.prefill_line and engine.serves_prefill:
        return 0.0
    since = engine.load.waiting_since
    return now - since if since < now else 0.0


def first_token_s(engine: Engine, step_s: float, split: bool) -> float:
    """Seconds from the prefill's end to the first token on decode engine `engine`: the
    measured handoff when there is one, never less than the step model's one and a half
    steps; a plain request's first token comes with its prefill's step."""
    if not split:
        return step_s
    modelled = FIRST_TOKEN_STEPS * step_s
    handoff = engine.load.handoff_s
    return handoff if handoff > modelled else modelled


def decode_step_s(engine: Engine) -> float:
    """Predicted decode step time with the legs this router runs and has placed there (0
    without a curve): reserved legs count until as many have started."""
    profile = engine.profile
    if profile is None:
        return 0.0
    c = profile.decode
    load = engine.load
    running = max(load.running, load.reserved)
    tokens = max(load.resident_tokens, load.reserved_tokens)
    arrivals = max(load.arrival_rate, load.reserved_arrivals)
    return (c.base_s + c.per_token_s * tokens + c.per_request_s * running
            + arrival_s(profile) * arrivals)


def stream_step_s(engine: Engine, tokens: int, arrivals: float, steps: int | None,
                  window_s: float, now: float, budget: float,
                  joining: bool) -> tuple[float, float, float]:
    """(the engine's decode step with a stream of `tokens` resident tokens landing `arrivals`
    legs per step added when `joining`, else the step now; that step as the TPOT budget
    holds it: plus the engine's bounded bias and `TPOT_SPREAD_Z` spreads over the stream's
    `steps`; the streams counted). The streams counted are those running and reserved, less
    those the measured departure rate ends within `window_s`: each reserved one starts
    before the newcomer, and a stream known to run on is not assumed gone, so at most the
    reserved are counted out (in steady state as many end as start). A burst that meets
    streams just started counts them all, so it cannot over-admit before any has ended."""
    profile = engine.profile
    if profile is None:
        return 0.0, 0.0, 0.0
    c = profile.decode
    load = engine.load
    running = load.running
    reserved = load.reserved
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
        return 0.0, 0.0, streams
    resident = load.resident_tokens * (1.0 - share) + load.reserved_tokens
    rate = load.arrival_rate * (1.0 - share) + load.reserved_arrivals
    arrive = arrival_s(profile)
    extra = 1.0 if joining else 0.0
    mine = arrivals if joining else 0.0
    after = (c.base_s + c.per_token_s * (resident + tokens * extra)
             + c.per_request_s * (streams + extra) + arrive * (rate + mine))
    bias = load.tpot_error_s
    low, high = TTFT_MARGIN_FLOOR * budget, TTFT_MARGIN_CEILING * budget
    judged = after + (low if bias < low else high if bias > high else bias)
    landing = rate + mine
    if steps and steps > 1 and landing > 0.0:
        judged += TPOT_SPREAD_Z * arrive * math.sqrt(landing / steps)
    return after, judged, streams
