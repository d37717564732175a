"""The one owner of what the router booked on its engines: prefill queues and decode streams.

Why one owner: the scheduler prices every placement on the work this router already sent each
engine (`EngineLoad`), so every leg's start and end must reach that load exactly once, in
order, and be taken back exactly once when a request ends early. The proxy reports one event
per leg to its chooser's `Bookings` (placed, counting, prefill queued, sent and answered,
decode started and ended, handoff, finished) and keeps none of the bookkeeping; a request's
charges live in its `Booking` here, keyed by the request, from placement to its end.

The functions below the class are the per-engine transitions, kept as plain functions so a
unit test can drive one engine's load as data (tests/unit/serve/test_bookings.py). Their
rules, by load:
- prefill: a queue drain model. Every prefill dispatched to an engine pushes `busy_until` out
  by the prefill curve at that prompt length; when its last prefill in flight ends the queue
  is empty and `busy_until` snaps back to now. An engine runs every waiting prefill in its
  next step, so those all answer at that step's end, and an answer is the one sign the
  router gets that a step ended: at each answer every prefill still in flight is taken to run
  in the step starting then, and `busy_until` is re-anchored to now + their booked seconds,
  so the model's drift from the engine does not pile up.
- decode: each decode leg adds one running request, its resident tokens (prompt + half its
  `max_tokens`, the mean over its life) and its arrivals per step (1/max_tokens: each leg
  computes its last prompt token in a step every stream shares) until it ends; a leg placed
  but not started (its prefill runs) is reserved, so a burst of placements sees itself.
- what the engine teaches: departures (decayed over `DEPARTURE_TAU_S`), the measured handoff,
  the decode curve's bias and the projection's error, each a moving average.
"""

from __future__ import annotations

import math
import time
from typing import Protocol

from narwhal.serve.router.request.relay import DecodeRelay
from narwhal.serve.router.scheduling.engines import Engine, EngineLoad, Life, Placement
from narwhal.serve.router.scheduling.pricing import arrivals_per_step

HANDOFF_WEIGHT = 0.1  # weight of the newest handoff in an engine's moving average
TPOT_ERROR_WEIGHT = 0.125  # weight of the newest stream's TPOT error in its engine's bias
# Time constant of each decode engine's measured departure rate (streams ended per second):
# a few stream lives, so a phase change is followed within seconds.
DEPARTURE_TAU_S = 5.0
# Time constant of each engine's measured prefill share (prefill seconds booked per second).
PREFILL_SHARE_TAU_S = 2.0
# Weights of the newest stream in the projection error's moving mean and deviation: an engine
# ends tens of streams a second, and the margin should follow the last few swings.
PROJECTION_ERROR_WEIGHT = 1 / 32
PROJECTION_DEV_WEIGHT = 1 / 16
# A stream of fewer gaps than this teaches the projection nothing: its TPOT is a few steps'
# noise (docs/router.md, "Decode admission by projected lives").
PROJECTION_MIN_GAPS = 16


class BookedRequest(Protocol):
    """What bookings read about a request (proxy.Call)."""

    @property
    def price_tokens(self) -> int: ...

    @property
    def max_tokens(self) -> int | None: ...

    @property
    def placement(self) -> Placement | None: ...

    @property
    def t0(self) -> float: ...

    @property
    def tpot_s(self) -> float | None: ...


class Booking:
    """One request's charges, placement to end: the prefill seconds booked on a queue and
    the engine holding them while its leg is not sent (`prefill_unsent`), and its decode
    stream (engine, resident tokens, arrivals per step, live or reserved, whole or split)."""

    __slots__ = ("decode_arrivals", "decode_charge", "decode_engine", "decode_live",
                 "decode_whole", "plain_leg", "prefill_charge", "prefill_unsent")

    def __init__(self) -> None:
        self.prefill_charge = 0.0
        self.prefill_unsent: Engine | None = None
        self.decode_engine: Engine | None = None
        self.decode_charge = 0
        self.decode_arrivals = 0.0
        self.decode_live = False
        self.decode_whole = False
        self.plain_leg = False  # the running decode leg prefills on its engine too


class Bookings:
    """Every request's booking, and the events that move them (see the module docstring)."""

    def __init__(self) -> None:
        self._by_request: dict[object, Booking] = {}

    def __len__(self) -> int:
        return len(self._by_request)

    def placed(self, request: BookedRequest, placement: Placement) -> None:
        """Placed: its decode stream is reserved on the decode engine from now on."""
        booking = Booking()
        self._by_request[request] = booking
        self._book_decode(request, booking, placement.decode, not placement.single, False)

    def counting(self, request: BookedRequest) -> None:
        """Its prompt is being counted before its legs: a split request's prefill is booked
        now on its placement's prefill engine, so requests placed meanwhile see it."""
        placement = request.placement
        if placement is None or placement.single:
            return
        booking = self._by_request[request]
        booking.prefill_charge = prefill_started(placement.prefill, request.price_tokens,
                                                 time.monotonic())
        booking.prefill_unsent = placement.prefill

    def prefill_queued(self, request: BookedRequest, engine: Engine) -> None:
        """Its prefill leg is bound for `engine` (sent, or waiting in the router's line):
        booked on its queue, or repriced on the exact count if booked there already."""
        booking = self._by_request[request]
        if booking.prefill_unsent is engine:
            booking.prefill_charge = prefill_repriced(engine, booking.prefill_charge,
                                                      request.price_tokens)
        else:
            booking.prefill_charge = prefill_started(engine, request.price_tokens,
                                                     time.monotonic())
            booking.prefill_unsent = engine

    def prefill_sent(self, request: BookedRequest, engine: Engine) -> None:
        """Its prefill leg left the router for `engine`: an end now is the engine's answer,
        not a take-back; the leg counts among the engine's outstanding and its line's sent."""
        self._by_request[request].prefill_unsent = None
        engine.outstanding += 1
        engine.prefill_sent += 1

    def prefill_answered(self, request: BookedRequest, engine: Engine) -> None:
        """Its prefill leg ended on `engine` (answered or failed)."""
        engine.outstanding -= 1
        engine.prefill_sent -= 1
        prefill_ended(engine, time.monotonic(), self._by_request[request].prefill_charge)

    def decode_started(self, request: BookedRequest, engine: Engine, relay: DecodeRelay,
                       split: bool) -> None:
        """Its decode leg was sent to `engine`; not `split`, that engine prefills it too, in
        a step the streams already running there share."""
        engine.outstanding += 1
        booking = self._by_request[request]
        booking.plain_leg = not split
        if not split:
            booking.prefill_charge = prefill_started(engine, request.price_tokens,
                                                     time.monotonic())
        self._book_decode(request, booking, engine, split, True, relay)

    def decode_ended(self, request: BookedRequest, engine: Engine) -> None:
        """Its decode leg ended on `engine`; its stream stays booked until the request ends
        or a retry moves it, a plain leg's prefill ends here."""
        engine.outstanding -= 1
        booking = self._by_request[request]
        if booking.plain_leg:
            prefill_ended(engine, time.monotonic(), booking.prefill_charge)

    def prefills_done_at(self, engine: Engine) -> float:
        """When the prefills booked on `engine` should be done (monotonic clock): a stream
        there may wait that long for its next step."""
        return engine.load.busy_until

    def handoff(self, engine: Engine, seconds: float) -> None:
        """A split request's first token came `seconds` after its prefill reply."""
        handoff_seen(engine, seconds)

    def tpot_seen(self, engine: Engine, error_s: float) -> None:
        """A stream decoded on `engine` ended `error_s` off its predicted TPOT."""
        load = engine.load
        load.tpot_error_s += TPOT_ERROR_WEIGHT * (error_s - load.tpot_error_s)

    def finished(self, request: BookedRequest) -> None:
        """The request ended: its stream leaves, and a prefill booked but never sent is taken
        back (the prefills behind it move up)."""
        booking = self._by_request.pop(request, None)
        if booking is None:
            return
        self._unbook_decode(request, booking)
        unsent = booking.prefill_unsent
        if unsent is not None:
            booking.prefill_unsent = None
            prefill_ended(unsent, time.monotonic(), booking.prefill_charge, answered=False)

    def _book_decode(self, request: BookedRequest, booking: Booking, engine: Engine,
                     split: bool, live: bool, relay: DecodeRelay | None = None) -> None:
        """Reserved from placement on, running once its leg starts (`relay` streams it); a
        retry elsewhere moves it."""
        if booking.decode_engine is engine and booking.decode_live == live:
            if relay is not None:  # the same leg sent again: its life streams through this
                life = engine.load.lives.get(request)
                if life is not None:
                    life.relay = relay
            return
        self._unbook_decode(request, booking)
        booking.decode_charge = decode_tokens(request.price_tokens, request.max_tokens)
        # A leg with pulled KV computes its last prompt token in a shared step; a plain
        # request's whole prefill is booked on the queue instead.
        booking.decode_arrivals = arrivals_per_step(request.max_tokens) if split else 0.0
        placement = request.placement
        steps = request.max_tokens or 0
        if live:
            projected = (placement.projected_tpot_s
                         if placement is not None and placement.decode is engine else 0.0)
            decode_started(engine, booking.decode_charge, booking.decode_arrivals, steps,
                           request, relay, not split, projected)
        else:
            booking.decode_whole = not split
            decode_reserved(engine, booking.decode_charge, booking.decode_arrivals, not split,
                            request, request.t0, steps,
                            placement.decode_at if placement is not None else 0.0)
        booking.decode_engine = engine
        booking.decode_live = live

    def _unbook_decode(self, request: BookedRequest, booking: Booking) -> None:
        engine = booking.decode_engine
        if engine is None:
            return
        if booking.decode_live:
            decode_ended(engine, booking.decode_charge, booking.decode_arrivals, None, request,
                         request.tpot_s)
        else:
            decode_unreserved(engine, booking.decode_charge, booking.decode_arrivals,
                              booking.decode_whole, request)
            booking.decode_whole = False
        booking.decode_engine = None


def decode_tokens(price_tokens: int, max_tokens: int | None) -> int:
    """Tokens a request keeps resident while it decodes, on average over its life."""
    return price_tokens + (max_tokens >> 1 if max_tokens else 0)


def prefill_started(engine: Engine, tokens: int, now: float) -> float:
    """Book a prefill of `tokens` on the engine's queue: alone in a new step when the engine
    has none in flight, else in the batch waiting behind the step running now. Returns the
    seconds booked, which `prefill_ended` takes back."""
    profile = engine.profile
    load = engine.load
    cost = profile.prefill.seconds(tokens) if profile is not None else 0.0
    if load.prefill_pending <= 0:
        load.busy_until = now + cost
        load.waiting_since = math.inf
    else:
        busy = load.busy_until
        load.busy_until = (busy if busy > now else now) + cost
        if load.waiting_since > now:
            load.waiting_since = now
    load.prefill_pending += 1
    load.prefill_queued_s += cost
    if load.tracks_streams:
        load.prefill_work = load.prefill_work * math.exp(
            (load.prefill_done_at - now) / PREFILL_SHARE_TAU_S) + cost
        load.prefill_done_at = now
        # every stream running here shares the step this prefill runs in (overflow.py)
        for stream in load.streams.values():
            stream[1] += cost
    return cost


def prefill_repriced(engine: Engine, cost: float, tokens: int) -> float:
    """A prefill booked at `cost` seconds on its estimated prompt, now counted at `tokens`:
    the queue behind it moves by the difference. Returns the seconds booked now."""
    profile = engine.profile
    load = engine.load
    now_cost = profile.prefill.seconds(tokens) if profile is not None else 0.0
    delta = now_cost - cost
    if delta != 0.0 and load.prefill_pending > 0:
        load.busy_until += delta
        load.prefill_queued_s += delta
        if load.tracks_streams:
            _absorbed(load, delta)
    return now_cost


def _absorbed(load: EngineLoad, seconds: float) -> None:
    """Move the prefill seconds the engine's running streams absorbed, and its prefill work,
    by `seconds` (a booking repriced, or taken back unsent), never below zero."""
    work = load.prefill_work + seconds
    load.prefill_work = work if work > 0.0 else 0.0
    for stream in load.streams.values():
        absorbed = stream[1] + seconds
        stream[1] = absorbed if absorbed > 0.0 else 0.0


def prefill_ended(engine: Engine, now: float, cost: float, answered: bool = True) -> None:
    """A prefill booked at `cost` seconds answered (or failed). An answer marks the end of a
    real engine step: every prefill still in flight runs in the step that starts now, so the
    queue is re-anchored on the clock (the model's drift, either way, ends here); with none
    left in flight the queue is empty. Not `answered`: its leg was never sent (its request
    ended first), so the prefills behind it move up by its cost; that says nothing of the
    engine's steps, so the queue is not re-anchored, and nothing it was booked to delay was."""
    load = engine.load
    load.prefill_pending -= 1
    if load.prefill_pending <= 0:
        load.prefill_pending = 0
        load.prefill_queued_s = 0.0
        load.busy_until = now
        load.waiting_since = math.inf
    else:
        queued = load.prefill_queued_s - cost
        queued = queued if queued > 0.0 else 0.0
        load.prefill_queued_s = queued
        if answered:
            load.busy_until = now + queued
            load.waiting_since = math.inf
        else:
            load.busy_until -= cost
    if not answered and load.tracks_streams:
        _absorbed(load, -cost)


def decode_reserved(engine: Engine, resident_tokens: int, arrivals: float,
                    whole: bool = False, key: object = None, since: float = 0.0,
                    steps: int = 0, start_at: float = 0.0) -> None:
    """A request placed with its decode on `engine`; its leg starts after the prefill (or,
    `whole`, a plain request: its prefill on `engine` too, not booked until it is sent).
    With a `key` (its request) and `since` (when it was received), an engine that tracks
    streams keeps a split one among the legs about to land there (`EngineLoad.landing`); one
    that projects keeps it, `steps` tokens long (its max_tokens, 0: unknown), among those
    coming (`start_at`: when the router will send its leg, if it holds it)."""
    load = engine.load
    load.reserved += 1
    load.reserved_tokens += resident_tokens
    load.reserved_arrivals += arrivals
    if key is not None and load.projects:
        load.coming[key] = Life(steps, resident_tokens, None, whole, 0.0, start_at)
    if whole:
        load.whole_reserved += 1
    elif key is not None and load.tracks_streams:
        load.landing[key] = since


def decode_unreserved(engine: Engine, resident_tokens: int, arrivals: float,
                      whole: bool = False, key: object = None) -> None:
    load = engine.load
    if whole:
        load.whole_reserved -= 1
    load.reserved -= 1
    load.reserved_tokens -= resident_tokens
    rate = load.reserved_arrivals - arrivals
    load.reserved_arrivals = rate if load.reserved > 0 and rate > 1e-9 else 0.0
    if load.landing:
        if key is not None:
            load.landing.pop(key, None)
        if load.reserved <= 0:
            load.landing.clear()
    if load.coming:
        if key is not None:
            load.coming.pop(key, None)
        if load.reserved <= 0:
            load.coming.clear()


def decode_started(engine: Engine, resident_tokens: int, arrivals: float = 0.0,
                   steps: int = 0, key: object = None, relay: DecodeRelay | None = None,
                   plain: bool = False, projected: float = 0.0) -> None:
    """A decode leg started; with a `key` (its request) and `steps` (its max_tokens, 0:
    unknown), an engine that tracks streams (its chooser overflows) keeps it among those a
    prefill there would stretch, and one that projects keeps its life, read through `relay`
    as it streams (`plain`: it prefills there too; `projected`: its TPOT as admitted)."""
    load = engine.load
    if load.projects and key is not None:
        load.lives[key] = Life(steps, resident_tokens, relay, plain, projected)
    load.running += 1
    load.resident_tokens += resident_tokens
    load.arrival_rate += arrivals
    if key is not None and steps != 1 and load.tracks_streams:  # one token: no gap
        load.streams[key] = [float(steps - 1 if steps > 1 else 0), 0.0]


def decode_ended(engine: Engine, resident_tokens: int, arrivals: float = 0.0,
                 now: float | None = None, key: object = None,
                 tpot_s: float | None = None) -> None:
    """A decode leg ended (or moved away): its load leaves, and the engine's decayed count of
    departures (`departures_per_s` reads it as a rate) takes one more. On an engine that
    projects, a stream that ended with an observed TPOT (`tpot_s`) teaches the projection's
    error: that TPOT less the one last projected for it."""
    t = time.monotonic() if now is None else now
    load = engine.load
    if load.projects and key is not None:
        life = load.lives.pop(key, None)
        if (life is not None and tpot_s is not None and life.projected > 0.0
                and life.steps > PROJECTION_MIN_GAPS):
            error = tpot_s - life.projected
            mean = load.projection_error_s
            load.projection_error_dev_s += PROJECTION_DEV_WEIGHT * (
                abs(error - mean) - load.projection_error_dev_s)
            load.projection_error_s = mean + PROJECTION_ERROR_WEIGHT * (error - mean)
    load.running -= 1
    load.resident_tokens -= resident_tokens
    rate = load.arrival_rate - arrivals
    load.arrival_rate = rate if load.running > 0 and rate > 1e-9 else 0.0
    if key is not None:
        load.streams.pop(key, None)
    if load.running <= 0:
        load.streams.clear()
        load.lives.clear()
    load.departures = load.departures * math.exp(
        (load.departed_at - t) / DEPARTURE_TAU_S) + 1.0
    load.departed_at = t


def handoff_seen(engine: Engine, seconds: float) -> None:
    """A split request's first token came `seconds` after its prefill reply."""
    load = engine.load
    last = load.handoff_s
    load.handoff_s = seconds if last == 0.0 else last + HANDOFF_WEIGHT * (seconds - last)


def profile_rebound(engine: Engine) -> None:
    """A new profile row is bound to the engine: the biases measured were the old row's."""
    load = engine.load
    load.tpot_error_s = 0.0
    load.projection_error_s = load.projection_error_dev_s = 0.0


def chooser_owns(engine: Engine, projects: bool, tracks_streams: bool) -> None:
    """A chooser took the engine: which of the load's optional records it keeps."""
    engine.load.projects = projects
    engine.load.tracks_streams = tracks_streams


def departures_per_s(engine: Engine, now: float) -> float:
    """Decode legs ended per second on `engine`, exponentially weighted over
    `DEPARTURE_TAU_S` (0 until one ends)."""
    load = engine.load
    count = load.departures
    if count <= 0.0:
        return 0.0
    return count * math.exp((load.departed_at - now) / DEPARTURE_TAU_S) / DEPARTURE_TAU_S


def prefill_share(engine: Engine, now: float) -> float:
    """The share of the engine's time its booked prefills took, weighted over
    `PREFILL_SHARE_TAU_S` (0 until one is booked)."""
    load = engine.load
    work = load.prefill_work
    if work <= 0.0:
        return 0.0
    return work * math.exp((load.prefill_done_at - now) / PREFILL_SHARE_TAU_S) / PREFILL_SHARE_TAU_S
