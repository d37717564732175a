"""Measuring one idle engine: its facts, a prefill sweep and a decode sweep, as raw samples.

Prefill: one request at a time, a fresh prompt of each length, `max_tokens=1`, not streamed, so
the time is the prefill plus one sampling step and the HTTP round trip (which the fit's constant
absorbs). Repeats go round all lengths in turn, so slow drift spreads over every length.

Decode: `c` streams of a `ctx`-token prompt started together, each generating `decode_tokens`
tokens with EOS ignored. Where the engine exposes vLLM's histograms, the point is what the
engine recorded: the step time is the rise of `request_decode_time_seconds` over the `tokens - 1`
steps of each stream (vLLM's TPOT), and the batch it ran is tokens generated over engine steps
(`iteration_tokens_total`'s count), because whether `c` streams started together really ran
together is not for the client to assume. Chunk arrival times are only the fallback for other
engines (the window where every stream has its first token and none has finished, over the
tokens gained in it): a CPU-bound API server delivers tokens in bursts, which made real-engine
points read far too fast (docs/profile.md, "What it measures").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from narwhal.core.profiles import Generation
from narwhal.serve.engine_client import Completion, EngineCallFailed, EngineClient, MetricsPage
from narwhal.serve.profiler.plan import EngineLimits, SweepPlan
from narwhal.serve.profiler.prompts import PromptMaker
from narwhal.serve.profiler.stream import TimedStream, timed_stream

MIN_WINDOW_STEPS = 5
MIN_OVERLAP = 0.75  # a try whose engine batch reaches this share of c is kept at once
WINDOW_TRIES = 3
Report = Callable[[str, int, int], None]  # (phase, done, total)


class EngineBusy(Exception):
    """The engine has requests of its own: what it measured would be their noise."""


@dataclass(frozen=True)
class EngineFacts:
    """Read before measuring: who the engine is and what it accepts."""

    generation: Generation
    limits: EngineLimits


@dataclass(frozen=True)
class PrefillSample:
    target_tokens: int
    prompt_tokens: int
    seconds: float
    repeat: int


@dataclass(frozen=True)
class DecodePoint:
    concurrency: int  # streams started together
    context_tokens: int
    running: float  # the mean batch the engine ran (c when it is not measured)
    resident_tokens: int
    step_s: float
    steps: int  # engine steps of the point, or decode steps timed in the arrival window
    prompt_tokens: tuple[int, ...]


@dataclass
class Measurement:
    """Everything measured on one engine, with the generation before and after."""

    before: Generation
    after: Generation | None = None
    prefill: list[PrefillSample] = field(default_factory=list)
    decode: list[DecodePoint] = field(default_factory=list)


async def read_facts(client: EngineClient, model: str) -> EngineFacts:
    """Generation, limits and idleness (one /metrics, one /v1/models, one /version); EngineBusy
    or EngineCallFailed name what is wrong."""
    page = await client.metrics()
    generation = await client.generation(page)
    cards = await client.model_cards()
    card = next((c for c in cards if c["id"] == model), None)
    if card is None:
        served = ", ".join(str(c["id"]) for c in cards) or "nothing"
        raise EngineCallFailed(client.id, "GET /v1/models",
                               f"serves {served}, not the fleet's model {model}")
    max_model_len = card.get("max_model_len")
    if type(max_model_len) is not int:
        raise EngineCallFailed(client.id, "GET /v1/models", f"no max_model_len for {model}")
    running = page.total("vllm:num_requests_running")
    waiting = page.total("vllm:num_requests_waiting")
    if running or waiting:
        raise EngineBusy(f"{client.id} is busy ({running:g} running, {waiting:g} waiting): "
                         "profile it while it takes no traffic (stop the router or drain it)")
    return EngineFacts(generation, EngineLimits(max_model_len, _kv_capacity(page.samples)))


def _kv_capacity(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]) -> int | None:
    """num_gpu_blocks x block_size from vllm:cache_config_info's labels, when present."""
    for (name, labels), _ in samples.items():
        if name == "vllm:cache_config_info":
            lab = dict(labels)
            try:
                return int(lab["num_gpu_blocks"]) * int(lab["block_size"])
            except (KeyError, ValueError):
                return None
    return None


async def measure(client: EngineClient, model: str, plan: SweepPlan, before: Generation,
                  report: Report) -> Measurement:
    """Run the whole sweep on one engine; the generation is read again at the end."""
    out = Measurement(before)
    maker = PromptMaker(client, model)
    report("warmup", 0, 1)
    await maker.calibrate()
    _check(client, await client.complete(model, await maker.make(plan.prefill_lengths[0]), 1), "warmup")
    total = plan.prefill_total
    for repeat in range(plan.repeats):
        for length in plan.prefill_lengths:
            report("prefill", len(out.prefill), total)
            prompt = await maker.make(length)
            done = _check(client, await client.complete(model, prompt, 1), f"prefill {length}")
            out.prefill.append(PrefillSample(length, done.prompt_tokens, done.total_s, repeat))
    report("prefill", total, total)
    points = [(c, ctx) for ctx in plan.decode_contexts for c in plan.decode_concurrency]
    for i, (concurrency, context) in enumerate(points):
        report("decode", i, len(points))
        out.decode.append(await _decode_point_retried(client, model, maker, concurrency,
                                                      context, plan.decode_tokens))
    report("decode", len(points), len(points))
    out.after = await client.generation()
    return out


class _NoWindow(EngineCallFailed):
    """The streams of one decode point never all ran at once."""


async def _decode_point_retried(client: EngineClient, model: str, maker: PromptMaker,
                                concurrency: int, context: int, tokens: int) -> DecodePoint:
    """A decode point, tried up to WINDOW_TRIES times: whether the `c` streams overlap is a race
    (an API server sharing a core with its engine may admit the last stream only after the
    first has finished), so one poor overlap is not yet a verdict on the engine. The try whose
    batch came closest to `c` is kept; its `running` is the batch the engine really ran."""
    best: DecodePoint | None = None
    for attempt in range(WINDOW_TRIES):
        try:
            point = await _decode_point(client, model, maker, concurrency, context, tokens,
                                        last_try=attempt == WINDOW_TRIES - 1)
        except _NoWindow:
            if attempt == WINDOW_TRIES - 1 and best is None:
                raise
            continue
        if best is None or point.running > best.running:
            best = point
        if point.running >= MIN_OVERLAP * concurrency:
            break
    assert best is not None
    return best


async def _decode_point(client: EngineClient, model: str, maker: PromptMaker, concurrency: int,
                        context: int, tokens: int, last_try: bool = True) -> DecodePoint:
    prompts = [await maker.make(context) for _ in range(concurrency)]
    where = f"decode {concurrency}x{context}"
    before = await client.metrics()
    streams = await asyncio.gather(*(timed_stream(client, model, p, tokens, where) for p in prompts))
    after = await _settled_metrics(client, before, len(prompts))
    for s in streams:
        if len(s.times) < 2:
            raise EngineCallFailed(client.id, f"POST /v1/completions ({where})",
                                   f"streamed {len(s.times)} chunk(s), asked for {tokens} tokens")
    engine = _engine_point(before, after, streams, concurrency, context)
    if engine is not None:
        return engine
    if after.has(DECODE_TIME + "_count") and not last_try:
        # The engine keeps decode times but another request ran meanwhile, or not all of ours
        # were recorded: measure the point again rather than trust chunk arrival times.
        raise _NoWindow(client.id, f"POST /v1/completions ({where})",
                        "the engine's decode-time count did not rise by this point's streams; "
                        "is another client using the engine?")
    return _arrival_point(client, streams, concurrency, context, where)


def _arrival_point(client: EngineClient, streams: Sequence[TimedStream], concurrency: int,
                   context: int, where: str) -> DecodePoint:
    """The fallback for an engine without vLLM's step and decode-time families: the window in
    which every stream has its first token and none has finished, timed by chunk arrivals.
    The step is the window's length over the tokens each stream gained inside it. Gaps between
    chunks are not used one by one: a CPU-bound API server delivers tokens in bursts (several
    chunks back to back after a stall), and a median of gaps then measures the burst."""
    start = max(s.times[0] for s in streams)
    end = min(s.times[-1] for s in streams)
    gained = [s.tokens_by(end) - s.tokens_by(start) for s in streams] if end > start else [0]
    steps = sum(gained)
    if steps < MIN_WINDOW_STEPS or min(gained) <= 0:
        raise _NoWindow(client.id, f"POST /v1/completions ({where})",
                        f"only {steps} step(s) with all {concurrency} requests decoding, "
                        f"in {WINDOW_TRIES} tries "
                        "(does the engine run that many at once? see --max-num-seqs); "
                        "lower --decode-concurrency or raise --decode-tokens")
    middle = (start + end) / 2
    resident = sum(s.prompt_tokens + s.tokens_by(middle) for s in streams)
    return DecodePoint(concurrency, context, float(concurrency), resident,
                       (end - start) / (steps / concurrency), steps,
                       tuple(s.prompt_tokens for s in streams))


DECODE_TIME = "vllm:request_decode_time_seconds"
ITERATION_TOKENS = "vllm:iteration_tokens_total"


async def _settled_metrics(client: EngineClient, before: MetricsPage, streams: int) -> MetricsPage:
    """/metrics once the engine has recorded all `streams` requests' decode times: vLLM writes
    a request's stats just after its last chunk, so a scrape at once can miss the last ones.
    Polls for at most 2 s; an engine without the family is read once."""
    after = await client.metrics()
    for _ in range(40):
        if not after.has(DECODE_TIME + "_count") or (
                after.total(DECODE_TIME + "_count") - before.total(DECODE_TIME + "_count")
                >= streams):
            break
        await asyncio.sleep(0.05)
        after = await client.metrics()
    return after


def _engine_point(before: MetricsPage, after: MetricsPage, streams: Sequence[TimedStream],
                  concurrency: int, context: int) -> DecodePoint | None:
    """The point as the engine itself recorded it, when it exposes vLLM's decode-time and
    step histograms; None when a family is missing or not all streams were recorded.

    Step time: `vllm:request_decode_time_seconds` is each request's first-to-last token time
    stamped by the engine, so it holds however the API server delivered the tokens; over one
    point it is `(tokens - 1)` steps per stream (vLLM's TPOT). Extra counts are allowed: on a
    producer, a one-token request whose KV lease is released meanwhile is recorded at ~0 s.

    Batch: `vllm:iteration_tokens_total` counts engine steps, and every step that ran gave each
    running stream one token, so tokens generated over steps is the mean batch the engine ran.
    It is measured, not assumed: an API server sharing a core with its busy engine can admit
    the second of two streams only after the first finished (seen on real CPU engines,
    docs/profile.md), and a point recorded at c=2 would then teach the fit a c=1 step."""
    if not (after.has(DECODE_TIME + "_count") and after.has(ITERATION_TOKENS + "_count")):
        return None
    finished = after.total(DECODE_TIME + "_count") - before.total(DECODE_TIME + "_count")
    if finished < len(streams):
        return None
    spans = sum(s.tokens[-1] - 1 for s in streams if s.tokens)
    seconds = after.total(DECODE_TIME + "_sum") - before.total(DECODE_TIME + "_sum")
    steps = int(after.total(ITERATION_TOKENS + "_count") - before.total(ITERATION_TOKENS + "_count"))
    generated = sum(s.tokens[-1] for s in streams if s.tokens)
    if spans <= 0 or seconds <= 0 or steps < MIN_WINDOW_STEPS:
        return None
    running = min(float(concurrency), max(1.0, generated / steps))
    mean_prompt = sum(s.prompt_tokens for s in streams) / len(streams)
    mean_generated = generated / len(streams)
    resident = round(running * (mean_prompt + mean_generated / 2))
    return DecodePoint(concurrency, context, running, resident, seconds / spans, steps,
                       tuple(s.prompt_tokens for s in streams))


def _check(client: EngineClient, done: Completion, where: str) -> Completion:
    if done.status != 200 or done.prompt_tokens <= 0:
        message = done.body.get("error", done.body) if isinstance(done.body, dict) else done.body
        raise EngineCallFailed(client.id, f"POST /v1/completions ({where})",
                               f"answered {done.status}: {str(message)[:200]}")
    return done
