"""The curve-priced chooser prices decode engines in rank-floor order (decode_rank.py) and stops
early: its choice must be the one the pool-order scan that priced every engine made, ties
included. The reference below is that scan, kept here on the pricing primitives alone."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime

from narwhal.core.profiles import DecodeCurve, Generation, PrefillCurve, ProfileRow
from narwhal.serve.router.request.relay import DecodeRelay
from narwhal.serve.router.request.upstream import EnginePool
from narwhal.serve.router.scheduling.bookings import (
    decode_ended,
    decode_reserved,
    decode_started,
    handoff_seen,
)
from narwhal.serve.router.scheduling.costs import arrival_s, first_token_s, stream_step_s
from narwhal.serve.router.scheduling.decode_rank import HELD_KEY, OVER_KEY, decode_floors
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.scheduling.projection import projected_tpot_s
from narwhal.serve.router.scheduling.scheduler import CurvePriced, DecodeChoice
from narwhal.serve.router.settings import EngineSpec

FIT = {"fit_error": 0.02, "loo_error": 0.03, "samples": 12}
GEN = Generation(engine_version="0.11.0", process_start_time_seconds=1.0)
NOW = 100.0
# A few shared curves, so that many engines tie on their key, and some one-off ones.
SHARED = [(0.004, 2e-6, 1e-3), (0.006, 1e-6, 2e-3), (0.004, 2e-6, 1e-3 + 1e-12)]


def _engine(name: str, role: str, rng: random.Random) -> Engine:
    spec = EngineSpec(name, "http://h:1", "h", 1, role, role != "decode", role != "prefill",
                      b"h:1")
    e = Engine(spec, EnginePool("h", 1, connect_timeout_s=1, keepalive_s=1))
    base, per_token, per_request = (rng.choice(SHARED) if rng.random() < 0.8 else
                                    (rng.uniform(0.002, 0.01), rng.uniform(0, 4e-6),
                                     rng.uniform(0, 3e-3)))
    e.profile = ProfileRow(
        engine_id=name, generation=GEN, measured_at=datetime(2026, 11, 30, tzinfo=UTC),
        prefill=PrefillCurve(a_s=rng.choice([0.01, 0.02]), b_s_per_token=1e-4,
                             c_s_per_token2=0.0, max_prompt_tokens=8192, **FIT),
        decode=DecodeCurve(base_s=base, per_token_s=per_token, per_request_s=per_request,
                           max_requests=256, max_resident_tokens=1_000_000, **FIT))
    return e


def _load(e: Engine, rng: random.Random, budget: float, crowded: bool) -> None:
    """Streams running and reserved on `e` as the bookings book them: most with a life the
    projection walks, streamed some of their tokens about the budget apart (so that a leg
    may be held until they end), some without a life (not projectable), some held to a
    later start. `crowded`: no engine idle, and streams near their end."""
    for k in range(rng.choice([6, 10, 13] if crowded else [0, 0, 0, 1, 2, 3, 6, 12])):
        steps = rng.choice([8, 40] if crowded else [1, 8, 40, 200])
        key = None if rng.random() < 0.1 else f"{e.id}-run{k}"
        done = rng.randrange(steps - 6 if crowded else 0, steps)
        relay = DecodeRelay(lambda _r: None, 1.0, 1.0)
        relay.events, relay.t_last = done, NOW
        relay.t_first = NOW - (done - 1) * budget * rng.uniform(0.7, 1.0) if done else 0.0
        decode_started(e, rng.randrange(10, 6000), 1 / steps, steps, key, relay)
    for k in range(rng.choice([0, 0, 1, 2, 4])):
        steps = rng.choice([8, 40, 200])
        start_at = NOW + rng.uniform(0.0, 0.5) if rng.random() < 0.3 else 0.0
        decode_reserved(e, rng.randrange(10, 4000), 1 / steps, rng.random() < 0.2,
                        f"{e.id}-res{k}", NOW - 0.1, steps, start_at)
    if rng.random() < 0.3:  # a departure rate: reserved streams may count some as gone
        decode_started(e, 100, 0.0, 0, "gone")
        decode_ended(e, 100, 0.0, NOW - rng.uniform(0.0, 3.0), "gone")
    if rng.random() < 0.3:
        handoff_seen(e, rng.uniform(0.0, 0.2))
    if rng.random() < 0.05:
        e.ejected = True
    if rng.random() < 0.05:
        e.held = "reprofile"
    if e.spec.can_prefill and rng.random() < 0.3:
        e.serves_decode = False


def _fleet(rng: random.Random) -> tuple[CurvePriced, list[Engine]]:
    n = rng.choice([1, 2, 3, 5, 8, 16, 40])
    engines = [_engine(f"d{i}", "both" if rng.random() < 0.2 else "decode", rng)
               for i in range(n)] + [_engine("p0", "prefill", rng)]
    chooser = CurvePriced(engines, ttft_s=rng.choice([0.5, 2.0]),
                          tpot_s=rng.uniform(0.008, 0.05), clock=lambda: NOW)
    crowded = rng.random() < 0.3
    for e in engines:
        _load(e, rng, chooser.tpot_s, crowded)
        if rng.random() < 0.2:
            chooser.bookings.tpot_seen(e, rng.uniform(-0.01, 0.01))
    return chooser, engines


def reference_decode(chooser: CurvePriced, tokens: int, arrivals: float,
                     exclude: Sequence[Engine], prefer: Engine | None, steps: int | None,
                     window_s: float, now: float, hold: bool) -> DecodeChoice | None:
    """The scan that priced every decode engine in pool order (before decode_rank.py)."""
    budget = chooser.tpot_s
    margin = chooser.ttft_margin_s
    ttft_limit = chooser.ttft_s - (margin if margin > 0.0 else 0.0)
    best: DecodeChoice | None = None
    best_key = math.inf
    for engine in chooser._decode:
        profile = engine.profile
        if (engine.ejected or engine.held or profile is None or not engine.serves_decode
                or engine in exclude):
            continue
        mine = 0.0 if engine is prefer else arrivals
        after, judged, streams = stream_step_s(engine, tokens, mine, steps, window_s, now,
                                               budget, True)
        own, starts = -1.0, window_s
        if engine.load.projects and steps and now > 0.0:
            limit = 0.0
            if hold and engine is not prefer:
                limit = ttft_limit - first_token_s(engine, after, True)
            seen = projected_tpot_s(engine, tokens, steps, engine is prefer, now, budget,
                                    window_s, limit)
            if seen is not None:
                judged, own, starts = seen.worst_s, seen.own_s, seen.starts_s
        c = profile.decode
        key = 1e9 + after if judged > budget else (
            c.per_token_s * tokens + c.per_request_s + arrival_s(profile) * mine)
        if starts > window_s and judged <= budget:
            key = 1e8 + starts
        if key < best_key or (key == best_key and best is not None
                              and best.engine is not prefer
                              and (engine is prefer or streams < best.streams)):
            best = DecodeChoice(engine, after, judged, own, starts, streams)
            best_key = key
    return best


def _fields(choice: DecodeChoice | None) -> tuple[object, ...] | None:
    if choice is None:
        return None
    return (choice.engine.id, choice.after_s, choice.judged_s, choice.own_s, choice.starts_s,
            choice.streams)


def _case(rng: random.Random) -> tuple[CurvePriced, dict[str, object]]:
    chooser, engines = _fleet(rng)
    decodes = [e for e in engines if e.spec.can_decode]
    prefer = rng.choice([None, rng.choice(engines), rng.choice(decodes)])
    steps = rng.choice([None, 1, 16, 200])
    args: dict[str, object] = {
        "tokens": rng.randrange(1, 8000),
        "arrivals": rng.choice([0.0, 1 / 16, 1 / 200]),
        "exclude": rng.sample(decodes, rng.randrange(0, min(3, len(decodes)) + 1)),
        "prefer": prefer, "steps": steps,
        "window_s": rng.choice([0.0, 0.01, rng.uniform(0.0, 0.3)]),
        "now": rng.choice([0.0, NOW]), "hold": rng.random() < 0.7}
    if rng.random() < 0.2:
        chooser.ttft_margin_s = rng.uniform(-0.05, 0.1)
    return chooser, args


def test_the_ranked_choice_is_the_pool_order_scan_s_on_random_fleets() -> None:
    rng = random.Random(43)
    kinds = {"none": 0, "within": 0, "held": 0, "over": 0, "tie": 0}
    for _ in range(600):
        chooser, args = _case(rng)
        want = reference_decode(chooser, **args)  # type: ignore[arg-type]
        got = chooser._best_decode(**args)  # type: ignore[arg-type]
        assert _fields(got) == _fields(want), args
        if want is None:
            kinds["none"] += 1
        elif want.judged_s > chooser.tpot_s:
            kinds["over"] += 1
        elif want.starts_s > args["window_s"]:  # type: ignore[operator]
            kinds["held"] += 1
        else:
            kinds["within"] += 1
            keys = [f[0] for f in decode_floors(chooser._decode, *_floor_args(args))]  # type: ignore[arg-type]
            if keys.count(min(keys)) > 1:
                kinds["tie"] += 1
    # the generator reaches every outcome (a held choice is rare: any engine that takes the
    # leg at once beats it; test_no_engine_ranks_below_its_floor counts held engines), and
    # engines that tie on their key
    assert all(count >= (1 if kind == "held" else 20) for kind, count in kinds.items()), kinds


def _floor_args(args: dict[str, object]) -> tuple[object, ...]:
    return (args["tokens"], args["arrivals"], args["exclude"], args["prefer"], args["window_s"])


def test_no_engine_ranks_below_its_floor() -> None:
    """The invariant the early stop rests on: each engine's exact rank (its key, then prefer,
    streams and position) is at or above the floor decode_floors gives it."""
    rng = random.Random(7)
    held = over = 0
    for _ in range(300):
        chooser, args = _case(rng)
        floors = {f[3]: f for f in decode_floors(chooser._decode, *_floor_args(args))}  # type: ignore[arg-type]
        for position, floor in floors.items():
            engine = chooser._decode[position]
            choice, key = chooser._price_decode(
                engine, args["tokens"], args["arrivals"], args["prefer"],  # type: ignore[arg-type]
                args["steps"], args["window_s"], args["now"], args["hold"])  # type: ignore[arg-type]
            assert floor <= (key, floor[1], choice.streams, position)
            held += HELD_KEY <= key < OVER_KEY
            over += key >= OVER_KEY
    assert held >= 20 and over >= 20, (held, over)


def test_equal_idle_engines_go_to_the_first_and_the_prefill_engine_wins_a_tie() -> None:
    engines = [_engine(f"d{i}", "both", random.Random(0)) for i in range(64)]
    chooser = CurvePriced(engines, ttft_s=2.0, tpot_s=0.05, clock=lambda: NOW)
    first = chooser._best_decode(100, 0.0, (), None, 16, 0.01, NOW, True)
    assert first is not None and first.engine is engines[0]
    # no legs land on the prefill engine itself: with arrivals 0 every key ties, and it wins
    plain = chooser._best_decode(100, 0.0, (), engines[40], 16, 0.01, NOW, True)
    assert plain is not None and plain.engine is engines[40]
    # fewer streams break a tie on the key: the earliest of the idle ones
    for e in engines[:5]:
        decode_started(e, 10, 0.0, 0)
    fewer = chooser._best_decode(100, 0.0, (), None, None, 0.0, NOW, False)
    assert fewer is not None and fewer.engine is engines[5]
