"""Timing model numbers and continuous batching: what the router's cost curves will see."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from narwhal.lab.engine.config import EmulatorOptions, StartupError, TimingOverrides
from narwhal.lab.engine.prefix_cache import PrefixCache
from narwhal.lab.engine.scheduler import Scheduler, Seq
from narwhal.lab.engine.timing import TimingModel, TimingProfile, load_timing


def test_prefill_is_quadratic_and_chunking_adds_up_to_the_whole() -> None:
    model = TimingModel(TimingProfile.model_validate(
        {"prefill": {"a": 0.01, "b": 1e-4, "c": 1e-7}}), zero_delay=False)
    assert model.prefill(1000) == pytest.approx(0.01 + 0.1 + 0.1)
    chunks = model.prefill_chunk(0, 400, True) + model.prefill_chunk(400, 1000, False)
    assert chunks == pytest.approx(model.prefill(1000))


def test_decode_step_is_linear_in_resident_tokens_and_requests() -> None:
    model = TimingModel(TimingProfile.model_validate(
        {"decode": {"base": 0.005, "per_token": 1e-6, "per_request": 1e-4}}), zero_delay=False)
    assert model.decode_step(4, 2000) == pytest.approx(0.005 + 0.002 + 0.0004)
    model.factor = 3.0
    assert model.decode_step(4, 2000) == pytest.approx(3 * (0.005 + 0.002 + 0.0004))
    assert model.decode_step(0, 0) == 0.0


def test_zero_delay_costs_nothing() -> None:
    model = TimingModel(TimingProfile(), zero_delay=True)
    assert model.prefill(5000) == 0.0 and model.decode_step(10, 10000) == 0.0


def test_profile_file_then_flags(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"prefill": {"a": 0.5, "b": 0.0, "c": 0.0},
                                   "decode": {"base": 0.25}}))
    emu = EmulatorOptions(timing_profile=profile, timing=TimingOverrides(prefill_b=0.001))
    model = load_timing(emu)
    assert model.prefill(10) == pytest.approx(0.5 + 0.01)
    assert model.decode_step(1, 0) == pytest.approx(0.25 + 5e-5)


@pytest.mark.parametrize("content", ['{"prefill": {"a": -1}}', '{"prefil": {}}', "not json",
                                     '{"decode": {"base": "fast"}}'])
def test_a_bad_profile_is_refused_naming_the_flag(tmp_path: Path, content: str) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(content)
    with pytest.raises(StartupError, match="--emu-timing-profile"):
        load_timing(EmulatorOptions(timing_profile=profile))


class Recorder:
    """Collects what the step loop reports (a plain observer, no behaviour of ours replaced)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, bool]] = []
        self.tokens: list[int] = []
        self.done: list[Seq] = []
        self.preemptions = 0

    def scheduled(self, seq: Seq) -> None: ...
    def first_token(self, seq: Seq) -> None: ...
    def token(self, seq: Seq, gap: float) -> None: ...

    def finished(self, seq: Seq) -> None:
        self.done.append(seq)

    def step(self, running: int, waiting: int, blocked_by_capacity: bool, used_blocks: int,
             total_blocks: int, tokens: int = 0) -> None:
        self.steps.append((running, waiting, blocked_by_capacity))
        self.tokens.append(tokens)

    def preempted(self, seq: Seq) -> None:
        self.preemptions += 1


def _run(seqs: list[Seq], *, num_blocks: int, block_size: int = 16, max_num_seqs: int = 256,
         budget: int = 8192) -> tuple[Scheduler, Recorder]:
    async def main() -> tuple[Scheduler, Recorder]:
        observer = Recorder()
        loop = asyncio.get_running_loop()
        scheduler = Scheduler(num_blocks=num_blocks, block_size=block_size,
                              max_num_seqs=max_num_seqs, max_batched_tokens=budget,
                              timing=TimingModel(TimingProfile(), zero_delay=True),
                              observer=observer, clock=loop.time, gate=lambda: None)
        scheduler.start()
        for seq in seqs:
            scheduler.submit(seq)
        await asyncio.wait_for(asyncio.gather(*(s.wait_for(s.output_len) for s in seqs)), 10)
        await scheduler.stop()
        return scheduler, observer

    return asyncio.run(main())


def test_at_most_max_num_seqs_run_and_every_request_finishes() -> None:
    seqs = [Seq(f"r{i}", prompt_len=20, output_len=5, planned_reason="length") for i in range(7)]
    scheduler, observer = _run(seqs, num_blocks=1000, max_num_seqs=2)
    assert scheduler.counters["max_running_seen"] == 2
    assert max(r for r, _, _ in observer.steps) == 2
    assert any(w > 0 for _, w, _ in observer.steps)
    assert all(s.finished and s.produced == 5 for s in seqs)
    assert scheduler.free_blocks == 1000


def test_requests_that_do_not_fit_in_kv_wait_for_capacity() -> None:
    # 4 blocks of 16 tokens: one 40-token prompt (3 blocks + room) fits at a time.
    seqs = [Seq(f"r{i}", prompt_len=40, output_len=3, planned_reason="length") for i in range(3)]
    scheduler, observer = _run(seqs, num_blocks=4)
    assert scheduler.counters["max_running_seen"] == 1
    assert any(blocked for _, _, blocked in observer.steps)
    assert all(s.finished for s in seqs)


def test_a_full_cache_preempts_the_newest_request_which_still_completes() -> None:
    seqs = [Seq(f"r{i}", prompt_len=15, output_len=40, planned_reason="length") for i in range(2)]
    scheduler, observer = _run(seqs, num_blocks=5)
    assert observer.preemptions >= 1 and scheduler.counters["preemptions"] >= 1
    assert [s.produced for s in seqs] == [40, 40]


def test_prefill_is_chunked_by_the_batched_token_budget() -> None:
    seq = Seq("long", prompt_len=1000, output_len=2, planned_reason="length")
    scheduler, observer = _run([seq], num_blocks=100, budget=256)
    assert scheduler.counters["steps"] >= 4 + 1
    # Each step reports the tokens it scheduled (vllm:iteration_tokens_total): full chunks,
    # the prompt's remainder, then one decode token.
    worked = [t for t in observer.tokens if t]
    assert worked[:3] == [256, 256, 256] and sum(worked) == 1000 + 1


def test_prefix_cache_hits_whole_blocks_and_never_the_last_token() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100, enabled=True)
    prompt = list(range(12))
    assert cache.lookup_and_insert(prompt) == 0
    assert cache.lookup_and_insert(prompt) == 8  # 3 full blocks, but the last token recomputes
    assert cache.lookup_and_insert([*prompt[:8], 99, 98, 97, 96, 95]) == 8
    assert PrefixCache(4, 100, enabled=False).lookup_and_insert(prompt) == 0
