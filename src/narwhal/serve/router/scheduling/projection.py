"""Decode admission by projected lives: the TPOT every stream on an engine would end with if a
newcomer joined it now.

Why project: a stream's TPOT is the mean of its gaps over its whole life, and most of the
streams a newcomer meets end within its own, so the step now overstates what it will see (the
instantaneous rule, costs.stream_step_s, holds a burst to the budget although most of what it
meets is gone before it ends). Each engine keeps every stream booked there (`EngineLoad.lives`
and `coming`: its length, its resident tokens, the relay that shows how many tokens it
streamed and over how long), and a newcomer is admitted where no stream, itself included,
would end past the TPOT budget with it, the steps ahead priced on the decode curve at the
streams still running in each. The projection's own error is measured per engine (observed
TPOT - the TPOT last projected for the stream, bookings.decode_ended) and its mean plus
`PROJECTION_ERROR_Z` deviations is the margin held back. Where a stream cannot be projected
(a length unknown), `projected_tpot_s` answers None and the chooser holds the step now to the
budget instead.

Holding a decode leg: when a split request's leg would push a stream past the budget now but
streams there end while its TTFT budget still has room, it is admitted with its leg held until
the first step at which every stream keeps the budget with it (`Placement.decode_at`; the
proxy sends the leg then, its KV waiting on the prefill engine). docs/router.md, "Decode
admission by projected lives", has what each rule measured.
"""

from __future__ import annotations

from bisect import bisect_right

from narwhal.serve.router.scheduling.costs import arrival_s
from narwhal.serve.router.scheduling.engines import Engine, Life
from narwhal.serve.router.scheduling.pricing import TTFT_MARGIN_CEILING, TTFT_MARGIN_FLOOR

# Deviations of the projection's measured error that admission holds back (projection_margin_s).
PROJECTION_ERROR_Z = 3.0


class Projection:
    """What `projected_tpot_s` found for a newcomer on one engine: the worst TPOT any stream
    there would end with, margin included; the newcomer's own (0 for a single token); and
    when its leg starts, in seconds from now (past the window: held)."""

    __slots__ = ("own_s", "starts_s", "worst_s")

    def __init__(self, worst_s: float, own_s: float, starts_s: float) -> None:
        self.worst_s = worst_s
        self.own_s = own_s
        self.starts_s = starts_s


class Stream:
    """One stream booked on the engine as the projection walks it: the step it starts at (0:
    running or landing now), the tokens it has left, the seconds its gaps took so far and how
    many gaps that was (-1: not started), and its `Life`, where its projected TPOT is kept."""

    __slots__ = ("first", "gaps", "left", "life", "spent")

    def __init__(self, first: int, left: int, spent: float, gaps: int, life: Life) -> None:
        self.first = first
        self.left = left
        self.spent = spent
        self.gaps = gaps
        self.life = life


class Steps:
    """The seconds of the steps ahead without the newcomer: the curve's base plus the load
    running in each step (a step list where it changes, with the seconds summed up to each),
    the lumps landing at given steps (KV arrivals, queued prefills), and `spread` seconds
    landing evenly over the `start` steps before the newcomer's own. `changes` (step, load
    from then on) and `lumps` (step, seconds) come sorted by step."""

    __slots__ = ("base", "bounds", "loads", "lump_steps", "lump_sums", "spread", "start", "sums")

    def __init__(self, base: float, changes: list[tuple[int, float]],
                 lumps: list[tuple[int, float]], spread: float, start: int) -> None:
        self.base = base
        self.spread = spread
        self.start = start
        self.bounds: list[int] = []
        self.sums: list[float] = []
        self.loads: list[float] = []
        load = 0.0
        at = 0
        cum = 0.0
        for step, delta in changes:
            if step > at or not self.bounds:
                cum += (base + load) * (step - at)
                at = step
                self.bounds.append(at)
                self.sums.append(cum)
                self.loads.append(load)
            load += delta
            self.loads[-1] = load
        self.lump_steps: list[int] = []
        self.lump_sums: list[float] = []
        landed = 0.0
        for step, seconds in lumps:
            landed += seconds
            self.lump_steps.append(step)
            self.lump_sums.append(landed)

    def seconds(self, x: int) -> float:
        """Seconds of the next `x` steps without the newcomer."""
        bounds = self.bounds
        k = bisect_right(bounds, x) - 1
        total = self.base * x if k < 0 else self.sums[k] + (
            self.base + self.loads[k]) * (x - bounds[k])
        k = bisect_right(self.lump_steps, x - 1) - 1
        if k >= 0:
            total += self.lump_sums[k]
        spread = self.spread
        if spread > 0.0:
            start = self.start
            total += spread if x >= start else spread * x / start
        return total


class _Walk:
    """What projected_tpot_s gathers from an engine's lives before pricing any start: the
    streams ahead, where the load changes, what lands when, and the step now with the
    newcomer (its seconds turn the window and the hold limit into steps)."""

    __slots__ = ("changes", "lumps", "spread", "step_s", "streams")

    def __init__(self, step_s: float, queued: float) -> None:
        self.step_s = step_s
        self.streams: list[Stream] = []
        self.changes: list[tuple[int, float]] = []  # (step, load from then on; < 0: leaves)
        self.lumps: list[tuple[int, float]] = [(0, queued if queued > 0.0 else 0.0)]
        self.spread = 0.0


def projection_margin_s(engine: Engine, budget: float) -> float:
    """What projected admission adds to a projected TPOT: the projection's measured error on
    this engine, its mean and `PROJECTION_ERROR_Z` deviations, bounded as `pricing.tpot_bias_s`
    bounds a bias."""
    load = engine.load
    margin = load.projection_error_s + PROJECTION_ERROR_Z * load.projection_error_dev_s
    low, high = TTFT_MARGIN_FLOOR * budget, TTFT_MARGIN_CEILING * budget
    return low if margin < low else high if margin > high else margin


def projected_tpot_s(engine: Engine, tokens: int, steps: int, plain: bool, now: float,
                     budget: float, window_s: float,
                     hold_limit_s: float = 0.0) -> Projection | None:
    """The worst TPOT on `engine` if a newcomer of `tokens` resident tokens and `steps` tokens
    joined (None when the engine's streams cannot be projected: one of unknown length, or
    booked without a life). Its leg starts `window_s` from now (its prefill), or, when that
    would push a stream past the budget, as late as `hold_limit_s` from now: the first step
    at which streams booked here end and every stream keeps the budget. `plain`: it prefills
    there, no KV lands. Each stream's life keeps what it was projected with the newcomer
    (`Life.pending`, which `commit_projections` makes its expectation when it is placed).

    A stream ends with the time its gaps took so far (from its relay) plus its remaining
    steps, over its gaps. A leg sent but without a first token lands at once, and the
    prefills queued here run at once; legs still reserved (their prefills run elsewhere) land
    while the newcomer's own prefill runs, spread over the steps before it would start, and a
    held leg lands and starts at the step it is held to. Streams admitted later are not in
    it: each is admitted only if every stream here keeps the budget with it. A stream
    projected past the budget without the newcomer does not refuse it (its budget is lost
    either way); one within the budget but not the margin does."""
    profile = engine.profile
    load = engine.load
    if profile is None or steps < 1:
        return None
    if len(load.lives) != load.running or len(load.coming) != load.reserved:
        return None
    c = profile.decode
    mine = c.per_request_s + c.per_token_s * tokens
    total = mine
    for life in load.lives.values():
        total += c.per_request_s + c.per_token_s * life.tokens
    for life in load.coming.values():
        total += c.per_request_s + c.per_token_s * life.tokens
    walk = _Walk(c.base_s + total, load.busy_until - now)
    start = int(window_s / walk.step_s) if window_s > 0.0 else 0
    if not _walk_lives(engine, walk, now):
        return None
    walk.changes.sort()
    walk.lumps.sort()
    ahead = Steps(c.base_s, walk.changes, walk.lumps, walk.spread, start)
    landing = 0.0 if plain else arrival_s(profile)
    margin = projection_margin_s(engine, budget)
    limit = int(hold_limit_s / walk.step_s) if hold_limit_s > window_s else start
    worst = own = 0.0
    begin = start
    for begin in _starts(walk.changes, start, limit):
        worst, own = _project(walk.streams, ahead, begin, steps, mine, landing, budget)
        if worst + margin <= budget:
            break
    if worst + margin > budget:  # none fits: what it would be at its own start
        begin = start
        worst, own = _project(walk.streams, ahead, start, steps, mine, landing, budget)
    return Projection(worst + margin, own, begin * walk.step_s if begin > start else window_s)


def _walk_lives(engine: Engine, walk: _Walk, now: float) -> bool:
    """Gather the streams running and coming on `engine` into `walk`; False when one has an
    unknown length."""
    profile = engine.profile
    assert profile is not None
    c = profile.decode
    arrive = arrival_s(profile)
    for life in engine.load.lives.values():
        if life.steps <= 0:
            return False
        relay = life.relay
        done = relay.events if relay is not None else 0
        left = life.steps - done
        if left <= 0:
            life.pending = 0.0
            continue
        w = c.per_request_s + c.per_token_s * life.tokens
        walk.changes.append((0, w))
        walk.changes.append((left, -w))
        if relay is not None and done >= 2 and relay.t_last > relay.t_first:
            walk.streams.append(Stream(0, left, relay.t_last - relay.t_first, done - 1, life))
        elif done >= 1:
            walk.streams.append(Stream(0, left, 0.0, 0, life))
        else:
            if not life.plain:
                walk.lumps.append((0, arrive))
            walk.streams.append(Stream(0, left, 0.0, -1, life))
    for life in engine.load.coming.values():
        if life.steps <= 0:
            return False
        w = c.per_request_s + c.per_token_s * life.tokens
        first = 0
        if life.start_at > now:  # held: it lands and starts then
            first = int((life.start_at - now) / walk.step_s)
            walk.lumps.append((first, arrive))
        else:
            walk.spread += arrive if not life.plain else profile.prefill.seconds(life.tokens)
        walk.changes.append((first, w))
        walk.changes.append((first + life.steps, -w))
        walk.streams.append(Stream(first, life.steps, 0.0, -1, life))
    return True


def _starts(changes: list[tuple[int, float]], start: int, limit: int) -> list[int]:
    """The newcomer's first steps to try: `start`, then each step where streams end (`changes`
    sorted by step), up to the hold limit."""
    tries = [start]
    for step, delta in changes:
        if delta < 0.0 and start < step <= limit and step != tries[-1]:
            tries.append(step)
    return tries


def _project(streams: list[Stream], ahead: Steps, begin: int, steps: int, mine: float,
             landing: float, budget: float) -> tuple[float, float]:
    """(the worst TPOT a stream keeping the budget without it would end with, the newcomer's
    own) with the newcomer's leg starting at step `begin`; each life's `pending` takes its
    own."""
    end = begin + steps
    own = 0.0
    if steps > 1:  # its gaps: the steps after the one its first token comes in
        own = (ahead.seconds(end) - ahead.seconds(begin + 1) + mine * (steps - 1)) / (steps - 1)
    worst = own
    for stream in streams:
        last = stream.first + stream.left
        ahead_s = ahead.seconds(last)
        if stream.gaps < 0:  # not started: its gaps are the steps after its first
            if stream.left < 2:
                stream.life.pending = 0.0
                continue
            lo = stream.first + 1
            n = stream.left - 1
            without = (ahead_s - ahead.seconds(lo)) / n
        else:
            lo = 0
            n = stream.gaps + stream.left
            without = (stream.spent + ahead_s) / n
        overlap = (last if last < end else end) - (lo if lo > begin else begin)
        added = mine * overlap if overlap > 0 else 0.0
        if lo <= begin < last:
            added += landing
        tpot = without + added / n
        stream.life.pending = tpot
        if tpot > worst and without <= budget:
            worst = tpot
    return worst, own


def commit_projections(engine: Engine) -> None:
    """A request was placed on `engine` as projected: each stream there now expects the TPOT
    it was projected with it."""
    load = engine.load
    for life in load.lives.values():
        if life.pending > 0.0:
            life.projected = life.pending
    for life in load.coming.values():
        if life.pending > 0.0:
            life.projected = life.pending
