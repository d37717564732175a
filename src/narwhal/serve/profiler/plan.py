"""What to measure on one engine: prompt lengths, the decode grid, and the limits they must fit.

The operator's flags give a `SweepSettings`; each engine's own facts (its maximum model length
and KV capacity, read before measuring) turn it into a `SweepPlan`. Defaults follow the engine:
prompt lengths spread geometrically up to what it accepts, decode contexts that fit the KV cache
at the highest concurrency, because a sweep that preempts requests measures recomputation, not
decoding. An explicit flag that cannot fit is refused with the engine, the limit and the flag.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.core.errors import Problem

DEFAULT_REPEATS = 3
DEFAULT_CONCURRENCY = (1, 2, 4, 8)
DEFAULT_DECODE_TOKENS = 32
DEFAULT_PREFILL_POINTS = 8
SHORTEST_PROMPT = 32
LONGEST_DEFAULT_PROMPT = 4096  # beyond this the sweep costs minutes on a real GPU for little gain
SHORT_CONTEXT = 64
LONG_CONTEXT = 1024
KV_HEADROOM = 0.8  # the share of the KV cache a decode point may hold (no preemption)


@dataclass(frozen=True)
class SweepSettings:
    """The sweep as the operator asked for it; None means "derive from the engine"."""

    repeats: int = DEFAULT_REPEATS
    prefill_lengths: tuple[int, ...] | None = None
    decode_concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    decode_contexts: tuple[int, ...] | None = None
    decode_tokens: int = DEFAULT_DECODE_TOKENS
    cover: int | None = None  # the default sweep's longest prompt is at least this (a workload's)


@dataclass(frozen=True)
class EngineLimits:
    """What one engine accepts: prompt plus output length, and tokens its KV cache holds."""

    max_model_len: int
    kv_capacity_tokens: int | None  # None when /metrics does not say


@dataclass(frozen=True)
class SweepPlan:
    """Exactly what one engine is measured with."""

    repeats: int
    prefill_lengths: tuple[int, ...]
    decode_concurrency: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_tokens: int

    @property
    def prefill_total(self) -> int:
        return self.repeats * len(self.prefill_lengths)

    @property
    def decode_total(self) -> int:
        return len(self.decode_concurrency) * len(self.decode_contexts)


def geometric(lo: int, hi: int, count: int) -> tuple[int, ...]:
    """`count` increasing integers from lo to hi, evenly spaced on a log scale (duplicates dropped)."""
    if hi <= lo or count < 2:
        return (lo,)
    ratio = (hi / lo) ** (1 / (count - 1))
    return tuple(sorted({round(lo * ratio ** i) for i in range(count)}))


def plan_for(engine_id: str, settings: SweepSettings, limits: EngineLimits
             ) -> tuple[SweepPlan | None, list[Problem]]:
    """The engine's plan, or the problems that stop it (each names the flag to change)."""
    problems: list[Problem] = []
    # Leave room for the one generated token (prefill) and the decode tokens (decode).
    prompt_cap = limits.max_model_len - 1
    capacity = limits.kv_capacity_tokens
    if capacity is not None:
        prompt_cap = min(prompt_cap, int(capacity * KV_HEADROOM))
    lengths = settings.prefill_lengths
    cover = settings.cover
    if cover is not None and cover > prompt_cap:
        problems.append(Problem("--cover", f"a {cover}-token prompt is more than engine "
                                f"{engine_id} takes ({prompt_cap}: max model length "
                                f"{limits.max_model_len}, KV capacity {capacity})",
                                "lower the workload's prompt length "
                                "(NARWHAL_WORKLOAD_PROMPT_TOKENS) or serve a longer context"))
    if lengths is None:
        top = min(prompt_cap, max(LONGEST_DEFAULT_PROMPT, cover or 0))
        lengths = geometric(min(SHORTEST_PROMPT, top), top, DEFAULT_PREFILL_POINTS)
    elif cover is not None and lengths[-1] < cover <= prompt_cap:
        problems.append(Problem("--prefill-lengths", f"the longest, {lengths[-1]} tokens, is "
                                f"short of the {cover} tokens to cover", "add a length of at "
                                f"least {cover} tokens"))
    elif lengths[-1] > prompt_cap:
        problems.append(Problem("--prefill-lengths", f"{lengths[-1]} tokens is more than engine "
                                f"{engine_id} takes ({prompt_cap}: max model length "
                                f"{limits.max_model_len}, KV capacity {capacity})",
                                f"keep every length at or below {prompt_cap}"))
    most = max(settings.decode_concurrency)
    context_cap = limits.max_model_len - settings.decode_tokens
    if capacity is not None:
        context_cap = min(context_cap, int(capacity * KV_HEADROOM) // most - settings.decode_tokens)
    contexts = settings.decode_contexts
    if contexts is None:
        long = min(LONG_CONTEXT, context_cap)
        contexts = (SHORT_CONTEXT, long) if long >= 2 * SHORT_CONTEXT else ()
        if not contexts:
            problems.append(Problem("--decode-concurrency", f"engine {engine_id} cannot hold "
                                    f"{most} requests of {2 * SHORT_CONTEXT}+ tokens "
                                    f"(room for {max(context_cap, 0)} each)",
                                    "lower the highest concurrency or --decode-tokens"))
    elif contexts[-1] > context_cap:
        problems.append(Problem("--decode-contexts", f"{contexts[-1]} tokens x {most} requests "
                                f"does not fit engine {engine_id} (at most {max(context_cap, 0)} "
                                f"each, with {settings.decode_tokens} decode tokens, KV capacity "
                                f"{capacity}, max model length {limits.max_model_len})",
                                f"keep contexts at or below {max(context_cap, 0)} or lower "
                                "--decode-concurrency"))
    if problems:
        return None, problems
    return SweepPlan(settings.repeats, lengths, settings.decode_concurrency, contexts,
                     settings.decode_tokens), []
