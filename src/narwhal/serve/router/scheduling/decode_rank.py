"""How decode engines rank for a placement, and which of them can still win it, in the order
the chooser prices them (scheduler.CurvePriced._best_decode).

Why: pricing a decode engine exactly (costs.stream_step_s, then projection.projected_tpot_s,
which walks every stream booked there) is most of a placement's cost, and pricing every engine
in the pool made each request's CPU grow with the fleet. Most engines cannot win, and a cheap
floor under each engine's rank says which:

- An engine's rank is `(key, not prefer, streams, position)`, lowest wins: the lowest key
  (`decode_key`); on equal keys the prefill engine itself (one plain request, no handoff), then
  the engine with fewer streams, then the one earlier in the pool. This is the order the
  pool-order scan kept: it replaced its best on a lower key, or on an equal key when its best
  was not the prefill engine and the newcomer was, or had fewer streams, so the first of the
  fewest-streams engines stayed.
- Its key is never below the smaller of `within_key` and HELD_KEY + the window: within the budget it is `within_key`; over it, OVER_KEY +
  the step with the request added, and that step holds each term of `within_key` plus the load
  already there (never negative: a profile's coefficients are not, nor are booked counts);
  held, HELD_KEY + a start past the window, above HELD_KEY + the window.
- Its streams counted are never below the larger of its running and reserved legs: the
  streams the measured departures take out number at most the smaller (costs.stream_step_s).

So an engine's floor `(that key floor, not prefer, max(running, reserved), position)` is never above
its rank, and reading the floors needs no stream walked. The chooser prices engines in floor
order and stops at the first floor above the best rank found: every engine not priced ranks at
or above its own floor, so none could have beaten the best. The choice is the pool-order scan's
exactly, ties included; only engines that cannot win go unpriced.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heapify

from narwhal.core.profiles import ProfileRow
from narwhal.serve.router.scheduling.costs import arrival_s
from narwhal.serve.router.scheduling.engines import Engine

# Keys of an engine whose step would miss the TPOT budget (+ that step) and of one whose leg
# would be held (+ its start): any engine within budget that takes the leg at once beats a
# held one, and a held one beats any over budget.
OVER_KEY = 1e9
HELD_KEY = 1e8

# (key or its floor, 0 for the prefill engine else 1, streams or their floor, pool position)
Rank = tuple[float, int, float, int]


def within_key(profile: ProfileRow, tokens: int, mine: float) -> float:
    """What a stream of `tokens` resident tokens landing `mine` legs per step adds to the
    engine's step: the key of an engine that keeps the budget with it and takes it at once."""
    c = profile.decode
    return c.per_token_s * tokens + c.per_request_s + arrival_s(profile) * mine


def decode_key(within: float, after_s: float, judged_s: float, budget_s: float, starts_s: float,
               window_s: float) -> float:
    """The engine's key: `within` when its step keeps the budget and the leg starts with the
    window, HELD_KEY + its start when it keeps the budget only held, else OVER_KEY + its step
    with the request added."""
    if judged_s > budget_s:
        return OVER_KEY + after_s
    if starts_s > window_s:
        return HELD_KEY + starts_s
    return within


def decode_floors(pool: Sequence[Engine], tokens: int, arrivals: float,
                  exclude: Sequence[Engine], prefer: Engine | None,
                  window_s: float) -> list[Rank]:
    """The floor of every engine of `pool` that may take the decode leg now, as a heap
    (heapq): popped in the order to price them. `arrivals`: legs per step the request lands,
    except on `prefer`, where it prefills itself and none land. A heap, not a sorted list:
    pricing usually stops after the first floor or two, so ordering the rest is wasted."""
    floors: list[Rank] = []
    held = HELD_KEY + window_s
    for position, engine in enumerate(pool):
        profile = engine.profile
        if not (engine.ejected or engine.held or profile is None or not engine.serves_decode
                or engine in exclude):
            chosen = engine is prefer
            within = within_key(profile, tokens, 0.0 if chosen else arrivals)
            load = engine.load
            running, reserved = load.running, load.reserved
            floors.append((within if within < held else held, 0 if chosen else 1,
                           float(running if running > reserved else reserved), position))
    heapify(floors)
    return floors
