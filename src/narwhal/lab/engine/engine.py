"""The engine behind the HTTP routes: plan a request's output, pull remote KV, queue it, hold KV.

This is the only module that talks to the KV connector, and only through nixl/api.py:
`remote_verdict` and `pull` before a `do_remote_prefill` request is queued (`release` after a
load failed), `hold` after a `do_remote_decode` request finishes at its length cap (vLLM's
pull-mode connector holds blocks only then; a request that stopped on EOS returns no
kv_transfer_params).

A `do_remote_prefill` request meets one of vLLM 0.32's three fates (nixl/params.py): its KV is
pulled; or `Got invalid KVTransferParams` is logged and it waits for a load that never starts
(it is parked until the client leaves); or, with no `remote_block_ids`, the engine core's
assertion fails and the engine dies: every request then fails with `EngineDead` and the process
exits non-zero (`on_dead`), as a real engine does.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from narwhal.lab.engine.config import EngineConfig
from narwhal.lab.engine.engine_plan import EnginePlan
from narwhal.lab.engine.faults import EngineFaults
from narwhal.lab.engine.generator import Generator, Planned
from narwhal.lab.engine.logs import ENGINE_CORE, at
from narwhal.lab.engine.metrics import EngineMetrics
from narwhal.lab.engine.nixl.api import KvConnector, KvLoadFailed
from narwhal.lab.engine.prefix_cache import EventSink, PrefixCache
from narwhal.lab.engine.scheduler import Scheduler, Seq
from narwhal.lab.engine.timing import TimingModel
from narwhal.lab.engine.tokenizer import Tokenizer

ENGINE_DEAD_MESSAGE = ("EngineCore encountered an issue. See stack trace (above) for the root "
                       "cause.")


class EngineDead(Exception):
    """The engine core is dead: vLLM's EngineDeadError, HTTP 500 with ENGINE_DEAD_MESSAGE."""

    def __init__(self) -> None:
        super().__init__(ENGINE_DEAD_MESSAGE)


@dataclass(frozen=True)
class Sampling:
    """What the engine needs from a request body, after validation."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM's cache_salt: the request's blocks are keyed under it, so it neither finds nor
    # leaves blocks any unsalted request can hit (the emulator does not keep them at all)
    cache_salt: str | None = None


@dataclass
class Run:
    """One request inside the engine."""

    request_id: str  # the response id (cmpl-..., chatcmpl-...)
    internal_id: str  # the engine's id, as vLLM suffixes it
    prompt_ids: list[int]
    planned: Planned
    seq: Seq
    produce_kv: bool
    kv_transfer_params: dict[str, Any] | None = field(default=None)
    salted: bool = False  # its blocks are not kept for others (Sampling.cache_salt)

    async def deltas(self, interval: int) -> AsyncIterator[tuple[int, int]]:
        """(start, end) slices of new tokens: the first at once, then every `interval` tokens,
        the last when the request finishes."""
        seq = self.seq
        sent = 0
        while True:
            await seq.wait_for(sent + (1 if sent == 0 else interval))
            produced = seq.produced
            if produced > sent:
                yield sent, produced
                sent = produced
            if seq.finished:
                return

    async def done(self) -> None:
        await self.seq.wait_for(self.planned_len)

    @property
    def planned_len(self) -> int:
        return len(self.planned.token_ids)

    @property
    def finish_reason(self) -> str | None:
        if not self.seq.finished:
            return None
        if self.seq.finish_reason == "abort":
            return "abort"
        return self.planned.finish_reason


class _Finishing:
    """The scheduler's observer: the engine's metrics, and the engine told of each request
    that finished."""

    def __init__(self, metrics: EngineMetrics, then: Callable[[Seq], None]) -> None:
        self._metrics = metrics
        self._then = then

    def scheduled(self, seq: Seq) -> None:
        self._metrics.scheduled(seq)

    def first_token(self, seq: Seq) -> None:
        self._metrics.first_token(seq)

    def token(self, seq: Seq, gap: float) -> None:
        self._metrics.token(seq, gap)

    def finished(self, seq: Seq) -> None:
        self._metrics.finished(seq)
        self._then(seq)

    def step(self, running: int, waiting: int, blocked_by_capacity: bool, used_blocks: int,
             total_blocks: int, tokens: int = 0) -> None:
        self._metrics.step(running, waiting, blocked_by_capacity, used_blocks, total_blocks,
                           tokens)

    def preempted(self, seq: Seq) -> None:
        self._metrics.preempted(seq)


class Engine:
    """Ties the tokenizer, generator, scheduler, metrics and connector together."""

    def __init__(self, cfg: EngineConfig, plan: EnginePlan, tokenizer: Tokenizer,
                 timing: TimingModel, metrics: EngineMetrics, faults: EngineFaults,
                 connector: KvConnector | None, log: logging.Logger,
                 cache_events: EventSink | None = None) -> None:
        self.cfg = cfg
        self.plan = plan
        self.tokenizer = tokenizer
        self.generator = Generator(tokenizer, cfg.emu.eos_probability)
        self.timing = timing
        self.metrics = metrics
        self.faults = faults
        self._last_pulled: list[int] = []  # the prompt of the last KV pulled (corrupt_pulls)
        self.connector = connector
        self.log = log
        self.loop = asyncio.get_running_loop()
        self.prefix_cache = PrefixCache(plan.block_size, plan.num_blocks,
                                        plan.launch.enable_prefix_caching, cache_events)
        self.scheduler = Scheduler(
            num_blocks=plan.num_blocks, block_size=plan.block_size,
            max_num_seqs=cfg.serve.max_num_seqs, max_batched_tokens=plan.max_num_batched_tokens,
            timing=timing, observer=_Finishing(metrics, self._finished), clock=self.loop.time,
            gate=faults.hang_gate)
        self._runs: dict[Seq, Run] = {}  # requests in flight, for their output at the end
        self.dead = False
        self.on_dead: Callable[[], None] | None = None  # the server's shutdown, set by it
        self._parked: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.scheduler.start()

    def unpark(self, error: Exception | None = None) -> None:
        """End the requests parked on a KV load that never starts: cancelled at shutdown (the
        client's connection closes), failed with `error` when the engine dies."""
        for future in list(self._parked):
            if future.done():
                continue
            if error is None:
                future.cancel()
            else:
                future.set_exception(error)

    async def stop(self) -> None:
        self.unpark()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.scheduler.stop()

    async def submit(self, request_id: str, prompt_ids: list[int], sampling: Sampling) -> Run:
        """Queue a request; KvLoadFailed when its remote KV cannot be loaded (policy "fail"),
        EngineDead when the engine core is (or just became) dead."""
        if self.dead:
            raise EngineDead
        arrival = self.loop.time()
        params = sampling.kv_transfer_params if self.connector is not None else None
        internal = f"{request_id}-0-{secrets.token_hex(4)}"
        external, queried = 0, False
        if params and params.get("do_remote_prefill"):
            queried = True
            external = await self._remote_prefill(params, prompt_ids, request_id, internal,
                                                  sampling, arrival)
        held = self._as_pulled(params, prompt_ids) if external else prompt_ids
        planned = self.generator.plan(held, sampling.max_tokens, sampling.min_tokens,
                                      sampling.ignore_eos)
        salted = bool(sampling.cache_salt)
        local_hit = 0 if salted else self.prefix_cache.lookup_and_insert(prompt_ids)
        if external:
            local_hit = 0
        seq = Seq(request_id, len(prompt_ids), len(planned.token_ids), planned.finish_reason,
                  local_hit=local_hit, external=external, arrival=arrival)
        self.metrics.admitted(len(prompt_ids), sampling.max_tokens, local_hit, external, queried)
        produce = bool(params and params.get("do_remote_decode"))
        run = Run(request_id, internal, prompt_ids, planned, seq, produce, salted=salted)
        self._runs[seq] = run
        self.scheduler.submit(seq)
        return run

    def _finished(self, seq: Seq) -> None:
        """A request ended: the blocks its reply filled join the prefix cache (not an
        aborted one's: vLLM frees those)."""
        run = self._runs.pop(seq, None)
        if run is not None and seq.finish_reason != "abort" and not run.salted:
            self.prefix_cache.keep_output(
                [*run.prompt_ids, *run.planned.token_ids[:seq.produced]])

    def _as_pulled(self, params: dict[str, Any] | None, prompt_ids: list[int]) -> list[int]:
        """The ids the KV a consumer pulled stands for: the prompt's own, unless the
        corrupt_pulls fault is on for its producer (faults.py): then another request's."""
        last, self._last_pulled = self._last_pulled, prompt_ids
        if params is None or not self.faults.corrupts(params):
            return prompt_ids
        if last and last != prompt_ids:
            return last
        return [*prompt_ids, prompt_ids[-1]]

    async def _remote_prefill(self, params: dict[str, Any], prompt_ids: list[int],
                              request_id: str, internal: str, sampling: Sampling,
                              arrival: float) -> int:
        """Prompt tokens whose KV was pulled (0: compute locally), after vLLM's verdict."""
        connector = self.connector
        assert connector is not None
        verdict = connector.remote_verdict(params)
        if verdict == "engine_dead":
            self.die(params)
            raise EngineDead
        if verdict == "invalid":
            self.log.warning("Got invalid KVTransferParams: %s. This request will not utilize "
                             "KVTransfer", params, extra=at("pull_scheduler.py:180", ENGINE_CORE))
            await self._park()
        self.metrics.fetching(1)
        try:
            cut = self.faults.cut_gate(params)
            if cut is not None:  # fault cut_pulls: nothing moves until the edge is back
                await cut
            outcome = await connector.pull(params, prompt_ids, internal)
        except KvLoadFailed as exc:
            self.log.error("%s", exc.log_line, extra=at("pull_worker.py:512", ENGINE_CORE))
            if self.cfg.kv_load_failure_policy != "recompute":
                self._load_failed(params, prompt_ids, request_id, sampling, arrival)
                raise
            self.log.warning("Recomputing the prompt locally (kv_load_failure_policy=recompute)",
                             extra=at("base_scheduler.py:611", ENGINE_CORE))
            return 0
        finally:
            self.metrics.fetching(-1)
        return outcome.tokens

    def _load_failed(self, params: dict[str, Any], prompt_ids: list[int], request_id: str,
                     sampling: Sampling, arrival: float) -> None:
        """Count the failed request as vLLM does (admitted, then finished with "error") and
        start the clean-up that tells the producer to free the blocks."""
        n = len(prompt_ids)
        self.metrics.admitted(n, sampling.max_tokens, 0, n, True)
        self.metrics.load_failed(n, self.loop.time() - arrival)
        connector = self.connector
        assert connector is not None
        bare = request_id.partition("-")[2] or request_id  # vLLM logs the clean-up's plain id
        task = self.loop.create_task(connector.release(params, bare), name="nixl-release")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _park(self) -> NoReturn:
        """Wait for a KV load that never starts; only cancellation (client gone, shutdown) or
        the engine's death ends it, so this never returns normally."""
        future: asyncio.Future[None] = self.loop.create_future()
        self._parked.add(future)
        self.metrics.parked(1)
        try:
            await future
        finally:
            self._parked.discard(future)
            self.metrics.parked(-1)
        raise asyncio.CancelledError

    def die(self, params: dict[str, Any]) -> None:
        """The engine core's assertion failed: log why, fail everything, then shut down."""
        if self.dead:
            return
        self.dead = True
        core = at("core.py:1512", ENGINE_CORE)
        self.log.error("EngineCore encountered a fatal error.", extra=core)
        self.log.error(
            "AssertionError (pull_scheduler.py, update_state_after_alloc: assert "
            "num_external_tokens == 0): kv_transfer_params %s ask for a remote prefill "
            "(do_remote_prefill) but carry no remote_block_ids, so there is nothing to pull for "
            "the tokens the scheduler reserved. The engine core is dead; every request now "
            "fails with HTTP 500 and the server shuts down. Send the producer's whole "
            "kv_transfer_params.", params, extra=core)
        self.log.error("Engine core proc EngineCore_DP0 died unexpectedly, shutting down "
                       "client.", extra=at("core_client.py:573"))
        self.scheduler.abort_all()
        self.unpark(EngineDead())
        if self.on_dead is not None:
            self.loop.call_soon(self.on_dead)

    def finish_kv(self, run: Run) -> dict[str, Any] | None:
        """Producer side: hold the prompt's blocks for the consumer; the response's params."""
        if (run.produce_kv and self.connector is not None and run.seq.finished
                and run.finish_reason == "length" and run.kv_transfer_params is None):
            run.kv_transfer_params = self.connector.hold(run.internal_id, run.prompt_ids)
        return run.kv_transfer_params

    def abort(self, run: Run) -> None:
        self.scheduler.abort(run.seq)

    def state(self) -> dict[str, Any]:
        s = self.scheduler
        return {"running": len(s.running), "waiting": len(s.waiting),
                "free_blocks": s.free_blocks, "num_blocks": s.num_blocks,
                "block_size": s.block_size, "max_num_seqs": s.max_num_seqs, **s.counters}
