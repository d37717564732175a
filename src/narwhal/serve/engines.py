"""Engines at run time and the seam that places a request's two legs on them.

`EngineChooser` is the scheduling seam: phase 1 fills it with `LeastOutstanding`, a plain
least-outstanding-legs policy over the prefill-capable and decode-capable pools. The
curve-priced scheduler, role flips and generation holds replace it behind the same three
methods without touching the data path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from narwhal.core.profiles import Generation, ProfileRow
from narwhal.serve.relay import DecodeRelay
from narwhal.serve.settings import EngineSpec
from narwhal.serve.upstream import EnginePool


class Life:
    """One decode stream booked on an engine, as the scheduler projects the rest of its life
    (scheduler.py, `projected_tpot_s`): its length in tokens (0: unknown), the tokens it keeps
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


class Engine:
    """Mutable run-time state of one engine; the request path reads and bumps counters only."""

    __slots__ = ("arrival_rate", "busy_until", "coming", "context_len", "departed_at",
                 "departures", "draining", "ejected", "ejected_reason", "ejections",
                 "fail_streak", "handoff_s", "held", "held_detail", "landing", "last_flip",
                 "last_ok", "live_generation", "lives", "outstanding", "pool",
                 "prefill_done_at", "prefill_line", "prefill_pending", "prefill_queued_s",
                 "prefill_sent", "prefill_work", "profile", "projection_error_dev_s",
                 "projection_error_s", "projects", "reserved", "reserved_arrivals", "reserved_tokens", "resident_tokens",
                 "running", "serves_decode", "serves_prefill", "spec", "streams",
                 "tpot_error_s", "tracks_streams", "waiting_since", "whole_reserved")

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
        # The scheduler's view of the work the router itself sent (scheduler.py): when the
        # prefill already queued here should be done (monotonic clock), how many prefills are
        # in flight, and the decode legs running with the tokens they keep resident.
        self.busy_until = 0.0
        self.prefill_pending = 0
        self.prefill_queued_s = 0.0  # the booked seconds of those prefills
        # The router's prefill line (scheduler.py, `PREFILL_LINE`; proxy.py): how many prefill
        # legs it lets the engine hold at once (0: no line, every leg is sent when placed),
        # and how many it holds now. The rest wait in the router, in the order placed.
        self.prefill_line = 0
        self.prefill_sent = 0
        self.running = 0
        self.resident_tokens = 0
        # Decode work placed here whose leg has not started yet (its prefill runs): counted
        # so a burst of placements sees itself, with its tokens and arrivals per step.
        self.reserved = 0
        self.reserved_tokens = 0
        self.reserved_arrivals = 0.0
        # The engine batches every waiting prefill into its next step, so they all answer when
        # that step ends: `waiting_since` is when the oldest prefill queued behind the step
        # running arrived (inf: none waits). A newcomer delays every one of those, so
        # admission prices it against the oldest (scheduler.py); behind a prefill line no
        # newcomer joins a batch at the engine, so none waits.
        self.waiting_since = math.inf
        # Decode legs that arrive per step, as the sum over running streams of 1/max_tokens:
        # each arrival computes its last prompt token in a step every stream shares.
        self.arrival_rate = 0.0
        # Decode legs ended here, as a count decayed over scheduler.DEPARTURE_TAU_S as of
        # `departed_at` (monotonic clock): admission reads it as the rate at which running
        # streams make room for the reserved ones (scheduler.py).
        self.departures = 0.0
        self.departed_at = 0.0
        # Seconds from a prefill leg's reply to the first token this engine streams for it
        # (moving average; 0 until measured): the KV pull and first step, part of the TTFT.
        self.handoff_s = 0.0
        # Observed - predicted TPOT of the streams decoded here (moving mean; 0 until one
        # ends): the bias of the bound profile's decode curve on this process, which
        # admission adds to its prediction (scheduler.py). A new profile starts it again.
        self.tpot_error_s = 0.0
        # Decode admission by projected lives (scheduler.py, `projected_tpot_s`), kept only
        # when `projects` (set by the curve-priced chooser): every stream running here and
        # every one reserved, keyed by request; and the projection's own error on this
        # process, observed TPOT - the TPOT last projected for the stream (moving mean and
        # mean deviation, 0 until a projected stream ends).
        self.projects = False
        self.lives: dict[object, Life] = {}
        self.coming: dict[object, Life] = {}
        self.projection_error_s = 0.0
        self.projection_error_dev_s = 0.0
        # A prefill on an engine with streams running stretches one step of every one of them
        # (scheduler.py, `CurvePriced._best_local`): per running stream (keyed by its
        # request), [its gaps between tokens (0: unknown), the prefill seconds it absorbed].
        self.streams: dict[object, list[float]] = {}
        # Whether `streams` and `prefill_work` are kept at all: only the overflow paths read
        # them, so a chooser without overflow (the default) leaves the request path without
        # that bookkeeping. Set by the chooser that owns the engine.
        self.tracks_streams = False
        # Split requests whose decode leg is reserved here (their prefill runs elsewhere),
        # keyed by request: when each was received (the chooser's clock). An overflow
        # prefill here delays the first token of any that lands meanwhile, so it is allowed
        # only while each would still meet TTFT (scheduler.py, `_best_local`). Kept only
        # with `tracks_streams`.
        self.landing: dict[object, float] = {}
        # Plain requests placed here whose leg has not been sent yet (their prompt is being
        # counted): their prefill is not on the queue and their stream not among `streams`.
        self.whole_reserved = 0
        # Prefill seconds booked here, a count decayed over scheduler.PREFILL_SHARE_TAU_S as
        # of `prefill_done_at`: the share of the engine's time prefill takes, which stretches
        # the gaps of any stream decoding beside it (scheduler.py, `prefill_share`).
        self.prefill_work = 0.0
        self.prefill_done_at = 0.0
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
            "prefill_pending": self.prefill_pending,
            "prefill_sent": self.prefill_sent,
            "decode_running": self.running,
            "decode_reserved": self.reserved,
            "decode_resident_tokens": self.resident_tokens,
            "decode_arrivals_per_step": round(self.arrival_rate, 4),
            "handoff_s": round(self.handoff_s, 6) or None,
            "tpot_model_error_s": round(self.tpot_error_s, 6),
            "projection_error": {"mean_s": round(self.projection_error_s, 6),
                                 "deviation_s": round(self.projection_error_dev_s, 6)},
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


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the legs go; `prefill is decode` means one plain request on that engine."""

    prefill: Engine
    decode: Engine
    predicted_ttft_s: float = 0.0  # what admission predicted (0: the chooser does not predict)
    predicted_tpot_s: float = 0.0  # the decode engine's step with it added, before any bias
    # the TPOT projected over its life (scheduler.py, `projected_tpot_s`; 0: not projected)
    projected_tpot_s: float = 0.0
    # when the router sends the decode leg (monotonic clock; 0: as soon as the prefill ends):
    # held until streams on the decode engine end, so that every stream there keeps TPOT
    decode_at: float = 0.0

    @property
    def single(self) -> bool:
        return self.prefill is self.decode


@dataclass(frozen=True, slots=True)
class Refusal:
    """Admission said no: no placement meets the TTFT budget (or, `over_tpot`, no decode engine
    keeps the TPOT budget with this request added); retry after this many seconds."""

    retry_after_s: int
    predicted_ttft_s: float
    ttft_budget_s: float
    over_share: bool = False  # refused first because its tenant is over its fair share
    over_tpot: bool = False  # every decode engine would step slower than the TPOT budget
    predicted_tpot_s: float = 0.0  # the best decode engine's step with this request added
    tpot_budget_s: float = 0.0


class EngineChooser(Protocol):
    def place(self, facts: RequestFacts) -> Placement | Refusal | None: ...

    def another_prefill(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None: ...

    def another_decode(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None: ...

    def finished(self, facts: RequestFacts) -> None:
        """A request that `place` placed has ended (whatever its outcome)."""


class LeastOutstanding:
    """Each leg goes to the admitted engine with the fewest legs in flight.

    Ties rotate so equal engines share load. For the decode leg a tie prefers the engine
    already chosen for prefill: one plain request then replaces two legs and a KV handoff.
    """

    def __init__(self, engines: Sequence[Engine]) -> None:
        self._prefill = tuple(e for e in engines if e.spec.can_prefill)
        self._decode = tuple(e for e in engines if e.spec.can_decode)
        self._turn = 0

    def _least(self, pool: tuple[Engine, ...], exclude: Sequence[Engine],
               prefer: Engine | None = None, *, prefill: bool) -> Engine | None:
        best: Engine | None = None
        best_key = 1 << 62
        n = len(pool)
        start = self._turn % n if n else 0
        for k in range(n):
            engine = pool[(start + k) % n]
            if engine.ejected or engine.held or engine in exclude:
                continue
            if not (engine.serves_prefill if prefill else engine.serves_decode):
                continue
            key = engine.outstanding * 2 + (0 if engine is prefer else 1)
            if key < best_key:
                best, best_key = engine, key
        return best

    def place(self, facts: RequestFacts) -> Placement | None:
        self._turn += 1
        first = self._least(self._prefill, (), prefill=True)
        if first is None:
            return None
        decode = self._least(self._decode, (), prefer=first, prefill=False)
        if decode is None:
            return None
        return Placement(first, decode)

    def another_prefill(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._least(self._prefill, exclude, prefill=True)

    def another_decode(self, facts: RequestFacts, exclude: Sequence[Engine]) -> Engine | None:
        return self._least(self._decode, exclude, prefill=False)

    def finished(self, facts: RequestFacts) -> None:
        pass
