"""Engines at run time, the load the router booked on each, and what a chooser answers.

The records here are shared by the request path and the scheduling family: an `Engine` (its
health, role and bound profile, written by health.py, roles.py and generation.py), its
`EngineLoad` (written by bookings.py alone), a `Placement` or a `Refusal`. The choosers
themselves live in choosers.py (the seam) and scheduler.py (curve pricing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from narwhal.core.profiles import Generation, ProfileRow
from narwhal.serve.router.request.relay import DecodeRelay
from narwhal.serve.router.request.upstream import EnginePool
from narwhal.serve.router.settings import EngineSpec


class Life:
    """One decode stream booked on an engine, as the scheduler projects the rest of its life
    (projection.py): its length in tokens (0: unknown), the tokens it keeps
    resident, the relay of its running leg (None while it is reserved: how many tokens it has
    streamed and when its first and latest came), whether it is a plain request, when a
    reserved leg the router holds will be sent (monotonic clock; 0: after its prefill), and
    its projected TPOT: `pending` from the latest placement priced on the engine, `projected`
    from the latest one admitted there (0: none yet), which its observed TPOT is held to."""

    __slots__ = ("pending", "plain", "projected", "relay", "start_at", "steps", "tokens")

    def __init__(self, steps: int, tokens: int, relay: DecodeRelay | None = None,
                 plain: bool = False, projected: float = 0.0, start_at: float = 0.0) -> None:
        self.steps = steps
        self.tokens = tokens
        self.relay = relay
        self.plain = plain
        self.projected = projected
        self.start_at = start_at
        self.pending = 0.0


@dataclass(slots=True)
class EngineLoad:
    """The work this router booked on one engine, as the scheduler prices it. Written only by
    bookings.py (tests/unit/serve/test_bookings.py holds it to that); the choosers, the role
    controller and /narwhal/state read it.

    Prefill is a queue: `busy_until` (monotonic clock) is when the prefills booked here should
    be done. The engine batches every waiting prefill into its next step, so they all answer
    when that step ends: `waiting_since` is when the oldest prefill queued behind the running
    step arrived (inf: none waits), and a newcomer is priced against it. Decode is counted by
    legs running and legs reserved (placed, their prefill running elsewhere), so a burst of
    placements sees itself."""

    busy_until: float = 0.0
    prefill_pending: int = 0  # prefills in flight
    prefill_queued_s: float = 0.0  # the booked seconds of those prefills
    waiting_since: float = math.inf
    running: int = 0  # decode legs running
    resident_tokens: int = 0  # the tokens they keep resident
    # Decode legs that arrive per step, as the sum over running streams of 1/max_tokens: each
    # arrival computes its last prompt token in a step every stream shares.
    arrival_rate: float = 0.0
    reserved: int = 0  # decode legs placed here whose leg has not started (their prefill runs)
    reserved_tokens: int = 0
    reserved_arrivals: float = 0.0
    # Plain requests placed here whose leg has not been sent (their prompt is being counted):
    # their prefill is not on the queue and their stream not among `streams`.
    whole_reserved: int = 0
    # Decode legs ended here, a count decayed over bookings.DEPARTURE_TAU_S as of
    # `departed_at`: the rate at which running streams make room for the reserved ones.
    departures: float = 0.0
    departed_at: float = 0.0
    # Seconds from a prefill leg's reply to the first token streamed here (moving average; 0
    # until measured): the KV pull and first step, part of the TTFT.
    handoff_s: float = 0.0
    # Observed - predicted TPOT of the streams decoded here (moving mean): the bound decode
    # curve's bias on this process. A new profile starts it again.
    tpot_error_s: float = 0.0
    # Decode admission by projected lives (projection.py), kept only when `projects` (set by
    # the curve-priced chooser): every stream running here and every one reserved, keyed by
    # request, and the projection's own error (moving mean and mean deviation).
    projects: bool = False
    lives: dict[object, Life] = field(default_factory=dict)
    coming: dict[object, Life] = field(default_factory=dict)
    projection_error_s: float = 0.0
    projection_error_dev_s: float = 0.0
    # Kept only when `tracks_streams` (the overflow paths read them, overflow.py): per running
    # stream, [its gaps between tokens (0: unknown), the prefill seconds it absorbed]; split
    # requests reserved here, when each was received; the prefill seconds booked here, decayed
    # over bookings.PREFILL_SHARE_TAU_S as of `prefill_done_at`.
    tracks_streams: bool = False
    streams: dict[object, list[float]] = field(default_factory=dict)
    landing: dict[object, float] = field(default_factory=dict)
    prefill_work: float = 0.0
    prefill_done_at: float = 0.0


class Engine:
    """Mutable run-time state of one engine; the request path reads and bumps counters only."""

    __slots__ = ("context_len", "draining", "ejected", "ejected_reason", "ejections",
                 "fail_streak", "held", "held_detail", "last_flip", "last_ok",
                 "live_generation", "load", "outstanding", "pool", "prefill_line",
                 "prefill_sent", "profile", "serves_decode", "serves_prefill", "spec")

    def __init__(self, spec: EngineSpec, pool: EnginePool) -> None:
        self.spec = spec
        self.pool = pool
        self.outstanding = 0
        self.fail_streak = 0
        self.ejected = False
        self.ejected_reason = ""
        self.ejections = 0
        self.last_ok = 0.0
        # max_model_len from the engine's /v1/models (health.py), 0 until read; the router
        # refuses a request that cannot fit it before any leg reserves KV (proxy.py).
        self.context_len = 0
        # Generation binding (generation.py): `held` is a reason ("reprofile", "no_profile")
        # while the engine may not be placed although it is healthy; `profile` is the row
        # whose generation equals the live one, the only curve this engine may be priced by.
        self.held = ""
        self.held_detail = ""
        self.profile: ProfileRow | None = None
        self.live_generation: Generation | None = None
        # The work the router booked here, as the scheduler prices it (bookings.py).
        self.load = EngineLoad()
        # The router's prefill line (scheduler.py, `PREFILL_LINE`; proxy.py): how many prefill
        # legs it lets the engine hold at once (0: no line, every leg is sent when placed),
        # and how many it holds now. The rest wait in the router, in the order placed.
        self.prefill_line = 0
        self.prefill_sent = 0
        # The legs the choosers may place here now. Fixed by the role for `prefill`/`decode`
        # engines; for `both` engines under role flips (roles.py) exactly one is set, or none
        # while the engine drains its decode streams before it takes prefills.
        self.serves_prefill = spec.can_prefill
        self.serves_decode = spec.can_decode
        self.draining = False
        self.last_flip: dict[str, object] | None = None

    @property
    def current_role(self) -> str:
        if self.draining:
            return "draining"
        if self.serves_prefill and self.serves_decode:
            return "both"
        return "prefill" if self.serves_prefill else "decode"

    @property
    def placeable(self) -> bool:
        return not self.ejected and not self.held

    @property
    def id(self) -> str:
        return self.spec.id

    def state(self) -> dict[str, object]:
        load = self.load
        return {
            "id": self.spec.id,
            "role": self.spec.role,
            "current_role": self.current_role,
            "last_flip": self.last_flip,
            "admitted": not self.ejected and not self.held,
            "ejected_reason": self.ejected_reason or None,
            "held_reason": self.held or None,
            "held_detail": self.held_detail or None,
            "generation": self.live_generation.model_dump() if self.live_generation else None,
            "outstanding": self.outstanding,
            "fail_streak": self.fail_streak,
            "ejections": self.ejections,
            "context_len": self.context_len or None,
            "prefill_pending": load.prefill_pending,
            "prefill_sent": self.prefill_sent,
            "decode_running": load.running,
            "decode_reserved": load.reserved,
            "decode_resident_tokens": load.resident_tokens,
            "decode_arrivals_per_step": round(load.arrival_rate, 4),
            "handoff_s": round(load.handoff_s, 6) or None,
            "tpot_model_error_s": round(load.tpot_error_s, 6),
            "projection_error": {"mean_s": round(load.projection_error_s, 6),
                                 "deviation_s": round(load.projection_error_dev_s, 6)},
        }


POOLS = ("prefill", "decode", "draining", "ejected", "held")


def pools(engines: Sequence[Engine]) -> dict[str, list[str]]:
    """Engine ids by what they take now: placeable ones by leg (a `both` engine in both), the
    rest by why not (ejected before held before draining). /narwhal/state shows it and
    /metrics counts it, so both always agree."""
    out: dict[str, list[str]] = {name: [] for name in POOLS}
    for e in engines:
        if e.ejected:
            out["ejected"].append(e.id)
        elif e.held:
            out["held"].append(e.id)
        elif e.draining:
            out["draining"].append(e.id)
        else:
            if e.serves_prefill:
                out["prefill"].append(e.id)
            if e.serves_decode:
                out["decode"].append(e.id)
    return out


class RequestFacts(Protocol):
    """What a chooser may read about a request."""

    @property
    def prompt_tokens(self) -> int | None: ...

    @property
    def max_tokens(self) -> int | None: ...

    @property
    def tenant(self) -> str | None: ...

    @property
    def price_tokens(self) -> int:
        """The prompt length to price placement by (exact if known, else an estimate)."""
        ...

    @property
    def ttft_error_s(self) -> float | None:
        """Observed - predicted TTFT, when the request got a first token on its first
        placement (no retried leg) and the placement carried a prediction; else None."""
        ...

    @property
    def tpot_error_s(self) -> float | None:
        """Observed - predicted TPOT on the placement's decode engine, on the same terms."""
        ...

    @property
    def placement(self) -> Placement | None: ...

    @property
    def cached(self) -> Mapping[str, int] | None:
        """Prompt tokens each engine holds in its prefix cache, by engine id, as the router's
        cache state predicts them (None: the router does not know the prompt's tokens)."""
        ...


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the legs go; `prefill is decode` means one plain request on that engine."""

    prefill: Engine
    decode: Engine
    predicted_ttft_s: float = 0.0  # what admission predicted (0: the chooser does not predict)
    predicted_tpot_s: float = 0.0  # the decode engine's step with it added, before any bias
    # the TPOT projected over its life (projection.py; 0: not projected)
    projected_tpot_s: float = 0.0
    # when the router sends the decode leg (monotonic clock; 0: as soon as the prefill ends):
    # held until streams on the decode engine end, so that every stream there keeps TPOT
    decode_at: float = 0.0
    # prompt tokens the engine that computes the prompt holds in its prefix cache, as priced
    cached_tokens: int = 0
    # run whole on `decode` because its cached prefix made that sooner than a split
    cache_local: bool = False

    @property
    def single(self) -> bool:
        return self.prefill is self.decode


# Which budget refused a request (`Refusal.kind`); admission.py produces each, decisions.py
# names the journal outcome and metric of each.
REFUSED_CAPACITY = "capacity"  # no placement meets the TTFT budget
REFUSED_OVER_SHARE = "over_share"  # near capacity, and its tenant is over its fair share
REFUSED_TPOT = "tpot"  # no decode engine keeps the TPOT budget with it added
REFUSAL_KINDS = (REFUSED_CAPACITY, REFUSED_OVER_SHARE, REFUSED_TPOT)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Admission said no (admission.py builds every one): which budget, what it predicted
    against which budget, when to retry, and the sentence the client reads (`detail`)."""

    kind: str
    retry_after_s: int
    predicted_ttft_s: float
    ttft_budget_s: float
    predicted_tpot_s: float = 0.0  # the best decode engine's step with this request added
    tpot_budget_s: float = 0.0
    detail: str = ""

    @property
    def over_share(self) -> bool:
        return self.kind == REFUSED_OVER_SHARE

    @property
    def over_tpot(self) -> bool:
        return self.kind == REFUSED_TPOT
