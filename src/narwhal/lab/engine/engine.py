"""The engine behind the HTTP routes: plan a request's output, pull remote KV, queue it, hold KV.

This is the only module that talks to the KV connector, and only through nixl/api.py:
`valid_remote_params` and `pull` before a `do_remote_prefill` request is queued, `hold` after a
`do_remote_decode` request finishes at its length cap (vLLM's pull-mode connector holds blocks
only then; a request that stopped on EOS returns no kv_transfer_params).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from narwhal.lab.engine.config import EngineConfig
from narwhal.lab.engine.engine_plan import EnginePlan
from narwhal.lab.engine.faults import EngineFaults
from narwhal.lab.engine.generator import Generator, Planned
from narwhal.lab.engine.logs import ENGINE_CORE, at
from narwhal.lab.engine.metrics import EngineMetrics
from narwhal.lab.engine.nixl.api import KvConnector, KvLoadFailed
from narwhal.lab.engine.prefix_cache import PrefixCache
from narwhal.lab.engine.scheduler import Scheduler, Seq
from narwhal.lab.engine.timing import TimingModel
from narwhal.lab.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class Sampling:
    """What the engine needs from a request body, after validation."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    kv_transfer_params: dict[str, Any] | None = None


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


class Engine:
    """Ties the tokenizer, generator, scheduler, metrics and connector together."""

    def __init__(self, cfg: EngineConfig, plan: EnginePlan, tokenizer: Tokenizer,
                 timing: TimingModel, metrics: EngineMetrics, faults: EngineFaults,
                 connector: KvConnector | None, log: logging.Logger) -> None:
        self.cfg = cfg
        self.plan = plan
        self.tokenizer = tokenizer
        self.generator = Generator(tokenizer, cfg.emu.eos_probability)
        self.timing = timing
        self.metrics = metrics
        self.faults = faults
        self.connector = connector
        self.log = log
        self.loop = asyncio.get_running_loop()
        self.prefix_cache = PrefixCache(plan.block_size, plan.num_blocks,
                                        plan.launch.enable_prefix_caching)
        self.scheduler = Scheduler(
            num_blocks=plan.num_blocks, block_size=plan.block_size,
            max_num_seqs=cfg.serve.max_num_seqs, max_batched_tokens=plan.max_num_batched_tokens,
            timing=timing, observer=metrics, clock=self.loop.time, gate=faults.hang_gate)

    def start(self) -> None:
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    async def submit(self, request_id: str, prompt_ids: list[int], sampling: Sampling) -> Run:
        """Queue a request; KvLoadFailed when its remote KV cannot be loaded (policy "fail")."""
        arrival = self.loop.time()
        params = sampling.kv_transfer_params if self.connector is not None else None
        external, queried = 0, False
        if params and params.get("do_remote_prefill"):
            queried = True
            external = await self._pull(params, prompt_ids)
        planned = self.generator.plan(prompt_ids, sampling.max_tokens, sampling.min_tokens,
                                      sampling.ignore_eos)
        local_hit = self.prefix_cache.lookup_and_insert(prompt_ids)
        if external:
            local_hit = 0
        seq = Seq(request_id, len(prompt_ids), len(planned.token_ids), planned.finish_reason,
                  local_hit=local_hit, external=external, arrival=arrival)
        self.metrics.admitted(len(prompt_ids), sampling.max_tokens, local_hit, external, queried)
        internal = f"{request_id}-0-{secrets.token_hex(4)}"
        produce = bool(params and params.get("do_remote_decode"))
        run = Run(request_id, internal, prompt_ids, planned, seq, produce)
        self.scheduler.submit(seq)
        return run

    async def _pull(self, params: dict[str, Any], prompt_ids: list[int]) -> int:
        connector = self.connector
        assert connector is not None
        if not connector.valid_remote_params(params):
            self.log.warning("Got invalid KVTransferParams: %s. This request will not utilize "
                             "KVTransfer", params, extra=at("base_scheduler.py:395", ENGINE_CORE))
            return 0
        try:
            outcome = await connector.pull(params, prompt_ids)
        except KvLoadFailed as exc:
            self.log.error("%s", exc.log_line, extra=at("pull_worker.py:512", ENGINE_CORE))
            if self.cfg.kv_load_failure_policy != "recompute":
                raise
            self.log.warning("Recomputing the prompt locally (kv_load_failure_policy=recompute)",
                             extra=at("base_scheduler.py:611", ENGINE_CORE))
            return 0
        return outcome.tokens

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
