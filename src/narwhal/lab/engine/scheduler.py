"""Continuous batching: one step loop paces every request, as vLLM's engine core does.

Each step admits waiting requests (first come, first served) while fewer than --max-num-seqs
run and their prompt fits in free KV blocks, gives every decoding request one token, spends the
rest of the --max-num-batched-tokens budget on prefill chunks, sleeps what the timing model says
the step costs, then hands out the tokens. A request whose next token needs a block that is not
free preempts the newest running request (recompute, as vLLM), which waits at the head of the
queue. What each request outputs is decided before it is queued; the scheduler only decides when.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Protocol

from narwhal.core.kv.blocks import cdiv
from narwhal.lab.engine.timing import TimingModel


class Seq:
    """One request as the scheduler sees it: token counts, KV blocks and timestamps."""

    __slots__ = (
        "_waiter",
        "arrival",
        "blocks",
        "charged",
        "computed",
        "decoding",
        "external",
        "finish_reason",
        "finished",
        "finished_at",
        "first_token_at",
        "last_token_at",
        "local_hit",
        "output_len",
        "planned_reason",
        "preemptions",
        "produced",
        "prompt_len",
        "rid",
        "scheduled_at",
        "wake_at",
    )

    def __init__(self, rid: str, prompt_len: int, output_len: int, planned_reason: str,
                 local_hit: int = 0, external: int = 0, arrival: float = 0.0) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.planned_reason = planned_reason
        self.local_hit = local_hit  # prompt tokens found in the prefix cache
        self.external = external  # prompt tokens whose KV was pulled from a remote engine
        self.computed = min(local_hit + external, max(prompt_len - 1, 0))
        self.produced = 0
        self.blocks = 0
        self.decoding = False
        self.charged = False  # the per-request prefill constant was paid
        self.preemptions = 0
        self.arrival = arrival
        self.scheduled_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        self.finished = False
        self.finish_reason: str | None = None
        self.wake_at = 1
        self._waiter: asyncio.Future[None] | None = None

    @property
    def target(self) -> int:
        """Context tokens whose KV must exist before the next token: prompt + generated."""
        return self.prompt_len + self.produced

    async def wait_for(self, count: int) -> None:
        """Return once `count` tokens exist or the request finished (cheap when already true)."""
        if self.produced >= count or self.finished:
            return
        self.wake_at = count
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and (self.finished or self.produced >= self.wake_at):
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


class SchedulerObserver(Protocol):
    """What the metrics layer hears from the step loop."""

    def scheduled(self, seq: Seq) -> None: ...
    def first_token(self, seq: Seq) -> None: ...
    def token(self, seq: Seq, gap: float) -> None: ...
    def finished(self, seq: Seq) -> None: ...
    def step(self, running: int, waiting: int, blocked_by_capacity: bool, used_blocks: int,
             total_blocks: int, tokens: int = 0) -> None: ...
    def preempted(self, seq: Seq) -> None: ...


class Scheduler:
    """The step loop and the queues; counters are read by /emu/state."""

    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int,
                 max_batched_tokens: int, timing: TimingModel, observer: SchedulerObserver,
                 clock: Callable[[], float], gate: Callable[[], asyncio.Future[None] | None]
                 ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max(max_batched_tokens, max_num_seqs)
        self.timing = timing
        self._observer = observer
        self._clock = clock
        self._gate = gate  # a future to await while the engine is hung, else None
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.free_blocks = num_blocks
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.counters = {"steps": 0, "admitted": 0, "finished": 0, "aborted": 0,
                         "preemptions": 0, "max_running_seen": 0, "max_waiting_seen": 0,
                         "tokens": 0}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine-core")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(self, seq: Seq) -> None:
        if seq.output_len <= 0:
            self._finish(seq, seq.planned_reason)
            return
        self.waiting.append(seq)
        self._work.set()

    def abort(self, seq: Seq) -> None:
        """The client went away: drop the request wherever it is and free its blocks."""
        if seq.finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
        self.counters["aborted"] += 1
        self._finish(seq, "abort")

    def abort_all(self) -> None:
        """The engine died: end every queued and running request (their waiters wake)."""
        for seq in [*self.running, *self.waiting]:
            self.abort(seq)

    def _finish(self, seq: Seq, reason: str) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0
        seq.finished = True
        seq.finish_reason = reason
        seq.finished_at = self._clock()
        self.counters["finished"] += 1
        self._observer.finished(seq)
        seq.wake()

    async def _loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self._work.clear()
                self._observer.step(0, 0, False, self.num_blocks - self.free_blocks,
                                    self.num_blocks)
                await self._work.wait()
            gate = self._gate()
            if gate is not None:
                await gate
                continue
            cost, emitting = self._schedule()
            if cost > 0.0:
                await asyncio.sleep(cost)
            else:
                await asyncio.sleep(0)
            self._emit(emitting)

    def _schedule(self) -> tuple[float, list[Seq]]:
        """Pick this step's work; returns (seconds it costs, requests that emit a token)."""
        bs = self.block_size
        emitting: list[Seq] = []
        for seq in list(self.running):
            if not seq.decoding:
                continue
            need = cdiv(seq.target + 1, bs) - seq.blocks
            if need <= 0 or self._grow(seq, need):
                emitting.append(seq)
        emitting = [s for s in emitting if s.decoding]  # a later growth may have preempted one
        budget = self.max_batched_tokens - len(emitting)
        resident = sum(s.computed for s in self.running)
        cost = self.timing.decode_step(len(emitting), resident)
        for seq in self.running:
            if budget <= 0:
                break
            if not seq.decoding:
                spent, budget = self._chunk(seq, budget, emitting)
                cost += spent
        blocked = False
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            need = cdiv(seq.target + 1, bs)
            if need > self.free_blocks:
                blocked = True
                break
            self.waiting.popleft()
            self.free_blocks -= need
            seq.blocks = need
            self.running.append(seq)
            self.counters["admitted"] += 1
            if seq.scheduled_at is None:
                seq.scheduled_at = self._clock()
                self._observer.scheduled(seq)
            spent, budget = self._chunk(seq, budget, emitting)
            cost += spent
        self.counters["steps"] += 1
        if len(self.running) > self.counters["max_running_seen"]:
            self.counters["max_running_seen"] = len(self.running)
        if len(self.waiting) > self.counters["max_waiting_seen"]:
            self.counters["max_waiting_seen"] = len(self.waiting)
        self._observer.step(len(self.running), len(self.waiting), blocked,
                            self.num_blocks - self.free_blocks, self.num_blocks,
                            self.max_batched_tokens - budget)
        return cost, emitting

    def _chunk(self, seq: Seq, budget: int, emitting: list[Seq]) -> tuple[float, int]:
        """Compute the next prefill chunk of `seq`; (its cost, budget left). A request whose
        prefill completes in this step emits its next token at the end of the step."""
        start = seq.computed
        end = min(seq.target, start + budget)
        seq.computed = end
        cost = self.timing.prefill_chunk(start, end, not seq.charged)
        seq.charged = True
        if end >= seq.target:
            emitting.append(seq)
        return cost, budget - (end - start)

    def _grow(self, seq: Seq, need: int) -> bool:
        """Find `need` blocks for a decoding request, preempting the newest others if needed."""
        while self.free_blocks < need:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.free_blocks -= need
        seq.blocks += need
        return True

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.free_blocks += seq.blocks
        seq.blocks = 0
        seq.computed = 0
        seq.decoding = False
        seq.charged = False
        seq.preemptions += 1
        self.counters["preemptions"] += 1
        self.waiting.appendleft(seq)
        self._observer.preempted(seq)

    def _emit(self, emitting: list[Seq]) -> None:
        now = self._clock()
        for seq in emitting:
            if seq.finished:
                continue
            if seq.decoding:
                seq.computed += 1
            seq.decoding = True
            seq.produced += 1
            self.counters["tokens"] += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                self._observer.first_token(seq)
            else:
                self._observer.token(seq, now - (seq.last_token_at or now))
            seq.last_token_at = now
            if seq.produced >= seq.output_len:
                if seq in self.running:
                    self.running.remove(seq)
                self._finish(seq, seq.planned_reason)
            else:
                seq.wake()
