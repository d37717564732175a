"""The real pair runs where the tier says it does: each engine's every thread on its own core,
so concurrent streams on either engine really run as one batch.

vLLM's NIXL worker on CPU moves its model thread to the machine's last core whatever `taskset`
allowed; the launcher pins it back (tests/real/engines.py `pin_to_core`). Without that the
prefill engine computed on the decode engine's core and admitted its streams one by one, which
the profiler then measured as batches of 1.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.real.engines import Engine, group_threads
from tests.real.live import Counters, completion, prompt_ids
from tests.real.session import Pair

STREAMS = 8
TOKENS = 32


def test_every_thread_of_each_engine_stays_on_its_own_core(pair: Pair) -> None:
    for engine in pair.engines:
        tids = group_threads(engine.process.pid)
        # API server, engine core and worker, each with its helper threads
        assert len(tids) > 10, f"{engine.spec.name}: only {len(tids)} thread(s) found"
        stray = {tid: sorted(cores) for tid, cores in _affinities(tids).items()
                 if cores != {engine.spec.core}}
        assert not stray, f"{engine.spec.name} (core {engine.spec.core}): threads elsewhere {stray}"


def _affinities(tids: list[int]) -> dict[int, set[int]]:
    """Each thread's allowed cores, read once; a thread that ended meanwhile is left out."""
    out: dict[int, set[int]] = {}
    for tid in tids:
        try:
            out[tid] = os.sched_getaffinity(tid)
        except OSError:
            continue
    return out


def _mean_batch(engine: Engine, seed: int) -> float:
    """Start STREAMS requests together; the batch the engine ran is tokens over engine steps."""
    before = Counters.read(engine.url)
    with ThreadPoolExecutor(STREAMS) as pool:
        replies = list(pool.map(lambda i: completion(engine.url, {
            "prompt": prompt_ids(seed=seed + i, length=64), "max_tokens": TOKENS,
            "ignore_eos": True, "temperature": 0}), range(STREAMS)))
    after = Counters.read(engine.url)
    generated = sum(int(r["usage"]["completion_tokens"]) for r in replies)
    steps = after.delta(before, "vllm:iteration_tokens_total_count")
    assert generated == STREAMS * TOKENS and steps > 0
    return generated / steps


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_concurrent_streams_run_as_one_batch_on_either_engine(pair: Pair, which: str) -> None:
    engine = pair.prefill if which == "prefill" else pair.decode
    # Steps include each stream's prefill step, so a full batch of 8 reads a little under 8.
    batch = max(_mean_batch(engine, seed=70_000 + 100 * attempt) for attempt in range(2))
    assert batch >= 0.6 * STREAMS, f"{which}: {STREAMS} streams ran as a mean batch of {batch:.2f}"
