"""The emulated NixlConnector (pull mode): side channel, handshakes, block reads and leases.

`make_connector` is the one entry point the HTTP engine calls. Everything it predicts (hash,
agent metadata, blocks and bytes per request) comes from core/kv for this engine's own plan;
this module only wires the pieces and turns their failures into vLLM's log lines.

Fault `recompute_instead_of_pull`: `remote_verdict` answers as usual, but `pull` moves
nothing and returns a PullOutcome with tokens=0 and bytes_moved=0, so the HTTP side counts the
prompt as local_compute (what vLLM does under kv_load_failure_policy "recompute"). The
producer's lease then runs out, as it would on a real fleet.

Fault `stale_peer`: when the switch turns on, the producer's NIXL agent takes a new incarnation
(a restart keeping its engine_id). A consumer holding the old handshake fails its next read
with NIXL_ERR_REMOTE_DISCONNECT and drops the handshake, so the request after re-hand-shakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import zmq.asyncio

from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.transfer import request_transfer
from narwhal.core.kv.versions import facts_for
from narwhal.lab.engine.nixl import failures
from narwhal.lab.engine.nixl.api import KvConnector, KvMetrics, PullOutcome, RemoteVerdict
from narwhal.lab.engine.nixl.handshake import HandshakeError, Handshaker
from narwhal.lab.engine.nixl.leases import BlockPool, LeaseTable
from narwhal.lab.engine.nixl.listener import SideChannelListener
from narwhal.lab.engine.nixl.params import (
    RemoteParams,
    parse_remote,
    producer_params,
    remote_verdict,
)
from narwhal.lab.engine.nixl.settings import (
    ConnectorConfig,
    FaultSwitches,
    NixlSettings,
    settle,
)
from narwhal.lab.engine.nixl.transfer import BlockServer, TransferError, notify, read_blocks
from narwhal.lab.engine.nixl.wire import (
    AgentBlob,
    agent_metadata,
    memory_type,
    num_kernel_blocks,
    payload_frame,
)

__all__ = ["ConnectorConfig", "FaultSwitches", "NixlConnector", "make_connector"]
LOG_SAMPLE = 8  # block ids shown in a failure's context, as vLLM's local_block_ids_sample


class NixlConnector:
    """One engine's connector; all TP/PP ranks of the engine live in this one object."""

    def __init__(self, settings: NixlSettings, geometry: Geometry, metrics: KvMetrics,
                 faults: FaultSwitches, log: logging.Logger) -> None:
        self.settings = settings
        self.geometry = geometry
        self.engine_id = settings.engine_id
        self.side_channel_host = settings.host
        self.side_channel_port = settings.port
        self._facts = facts_for(geometry.plan.vllm_version)
        self._metrics = metrics
        self._faults = faults
        self._log = log
        blocks = num_kernel_blocks(geometry) // geometry.physical_per_logical
        self.leases = LeaseTable(settings.lease_seconds, BlockPool(blocks), metrics, log)
        self._agent_name = str(uuid.uuid4())
        self._incarnation = uuid.uuid4().hex
        self._stale_seen = faults.stale_peer  # only a switch turned on while serving restarts
        self._payloads: dict[tuple[int, int], bytes] = {}
        self._payloads_for = ""
        self._server = BlockServer(self.leases, self.incarnation, log)
        self._context: zmq.asyncio.Context | None = None
        self._listener: SideChannelListener | None = None
        self._handshaker: Handshaker | None = None
        self._sweeper: asyncio.Task[None] | None = None

    # lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Bind the block server and the side channel; log vLLM's NIXL startup lines."""
        log, s = self._log, self.settings
        log.info("Initializing NIXL wrapper")
        log.info("Initializing NIXL worker %s", self.engine_id)
        if s.role == "kv_both":
            log.warning("kv_role 'kv_both' is deprecated for the NIXL connector; set "
                        "kv_producer for prefill and kv_consumer for decode instances")
        log.info("Registering KV_Caches. use_mla: %s, kv_buffer_device: %s, use_host_buffer: "
                 "%s", self.geometry.architecture.is_mla, s.buffer_device, False)
        factors = self.geometry.hash_factors
        log.debug("NIXL compatibility hash: %s (model=%s, dtype=%s, num_kv_heads=%s, "
                  "cache_dtype=%s, attn_backend=%s)", self.geometry.compatibility_hash,
                  factors["model"], factors["dtype"], factors["num_kv_heads"],
                  factors["cache_dtype"], factors["attn_backend_name"])
        self._context = zmq.asyncio.Context()
        try:
            await self._server.start(s.host)
            self._current_payloads()  # a field this release sends but we cannot fill fails here
            self._listener = SideChannelListener(self._context, s.host, s.port,
                                                 self._current_payloads, self._faults, log)
            await self._listener.start()
        except BaseException:
            await self.stop()
            raise
        self._handshaker = Handshaker(self._context, self.geometry, self._facts, s, log,
                                      self._metrics)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="nixl-lease-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._handshaker is not None:
            await self._handshaker.close()
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await self._server.stop()
        self.leases.clear()
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    @property
    def listener_alive(self) -> bool:
        return self._listener is not None and not self._listener.dead

    async def _sweep_forever(self) -> None:
        interval = min(1.0, max(0.02, self.settings.lease_seconds / 10))
        while True:
            await asyncio.sleep(interval)
            self.leases.sweep()

    # producer ----------------------------------------------------------------
    def incarnation(self) -> str:
        """The agent's current incarnation; fault stale_peer turning on starts a new one."""
        stale = self._faults.stale_peer
        if stale and not self._stale_seen:
            self._incarnation = uuid.uuid4().hex
            self._agent_name = str(uuid.uuid4())
            self._log.warning("fault stale_peer: NIXL agent restarted as %s (engine_id %s "
                              "kept); peers holding the old handshake will fail once",
                              self._agent_name, self.engine_id)
        self._stale_seen = stale
        return self._incarnation

    def _current_payloads(self) -> Mapping[tuple[int, int], bytes]:
        incarnation = self.incarnation()
        if self._payloads_for != incarnation:
            blob = AgentBlob(agent_name=self._agent_name, host=self._server.address,
                             port=self._server.port, incarnation=incarnation).encode()
            g, memory = self.geometry, memory_type(self.settings.buffer_device)
            self._payloads = {
                (pp, tp): payload_frame(g.compatibility_hash, agent_metadata(
                    g, self._facts, self.engine_id, pp, tp, blob, memory))
                for pp in range(g.pp) for tp in range(g.tp)}
            self._payloads_for = incarnation
        return self._payloads

    def hold(self, request_id: str, prompt_token_ids: list[int]) -> dict[str, Any]:
        """Keep the prompt's blocks under a lease; return vLLM 0.32's pull-mode params."""
        self.incarnation()
        plan = request_transfer(self.geometry, len(prompt_token_ids))
        lease = self.leases.hold(request_id, plan.stages[0].blocks_per_group,
                                 len(prompt_token_ids))
        params = producer_params(
            engine_id=self.engine_id, host=self.side_channel_host, port=self.side_channel_port,
            tp_size=self.geometry.tp, pp_size=self.geometry.pp, block_ids=lease.block_ids,
            request_id=request_id, num_tokens=len(prompt_token_ids))
        if self._faults.drop_lease_early:
            self.leases.expire(request_id)
        return params

    # consumer ----------------------------------------------------------------
    def remote_verdict(self, params: dict[str, Any]) -> RemoteVerdict:
        return remote_verdict(params)

    def _failure_context(self, request_id: str, remote: RemoteParams,
                         local_blocks: int) -> dict[str, Any]:
        """The Context vLLM's `_log_failure` prints for a request's failure."""
        return {"request_id": request_id, "engine_id": self.engine_id,
                "remote_engine_id": remote.engine_id, "remote_request_id": remote.request_id,
                "remote_host": remote.host, "remote_port": remote.port,
                "num_local_blocks": local_blocks,
                "num_remote_blocks": sum(len(g) for g in remote.block_ids),
                "local_block_ids_sample": list(range(1, min(local_blocks, LOG_SAMPLE) + 1))}

    async def pull(self, params: dict[str, Any], prompt_token_ids: list[int],
                   request_id: str = "") -> PullOutcome:
        if self._faults.recompute_instead_of_pull:
            return PullOutcome(tokens=0, bytes_moved=0, seconds=0.0, post_seconds=0.0,
                               descriptors=0, handshake_seconds=0.0)
        remote = parse_remote(params)
        if remote is None or self._handshaker is None:
            raise failures.report(self._log, "handshake_failed", {"engine_id": self.engine_id},
                                  "RuntimeError: Got invalid KVTransferParams"
                                  if remote is None else "RuntimeError: connector not started")
        plan = request_transfer(self.geometry, len(prompt_token_ids))
        context = self._failure_context(request_id or remote.request_id, remote,
                                        sum(plan.stages[0].blocks_per_group))
        try:
            peer, handshake_s = await self._handshaker.ensure(
                remote.engine_id, remote.host, remote.port, remote.tp_size, remote.pp_size)
        except HandshakeError as exc:  # counted once per handshake, by the handshaker
            raise failures.report(self._log, "handshake_failed", context, exc.line) from None
        nbytes = round(plan.total_bytes * self.settings.kv_scale)
        try:
            result = await read_blocks(peer.agent, remote.request_id, remote.block_ids, nbytes)
        except TransferError as exc:
            raise self._transfer_failed(exc, remote.engine_id, remote.request_id,
                                        context) from None
        outcome = PullOutcome(
            tokens=plan.transferred_tokens, bytes_moved=result.bytes_moved,
            seconds=result.seconds, post_seconds=result.post_seconds,
            descriptors=self.geometry.tp * sum(s.descriptors_per_rank for s in plan.stages),
            handshake_seconds=handshake_s)
        self._metrics.transfer_done(outcome)
        return outcome

    async def release(self, params: dict[str, Any], request_id: str) -> None:
        """vLLM's clean-up for a failed remote prefill: an empty-block "read" that only
        notifies the producer, which needs a handshake first (a second one when the first
        failed, so a failed handoff counts two failed handshakes once this has run)."""
        remote = parse_remote(params)
        if remote is None or self._handshaker is None:
            return
        try:
            peer, _ = await self._handshaker.ensure(
                remote.engine_id, remote.host, remote.port, remote.tp_size, remote.pp_size)
        except HandshakeError as exc:
            failures.report(self._log, "handshake_failed",
                            self._failure_context(request_id, remote, 0), exc.line)
            return
        try:
            await notify(peer.agent, remote.request_id)
        except TransferError as exc:
            self._metrics.transfer_failed()
            self._metrics.notification_failed()
            failures.report(self._log, "notification_failed",
                            {**self._failure_context(request_id, remote, 0), "error": exc.detail},
                            failures.REMOTE_DISCONNECT)

    def _transfer_failed(self, exc: TransferError, engine_id: str, request_id: str,
                         context: dict[str, Any]) -> Exception:
        """Count, log and map one failed read; transport failures drop the cached handshake."""
        self._metrics.transfer_failed()
        context = {**context, "error": exc.detail}
        if exc.kind == "notify":
            self._metrics.notification_failed()
        line, drop = failures.for_transfer(exc.kind, engine_id, request_id)
        if drop and self._handshaker is not None:
            self._handshaker.forget(engine_id)
        return failures.report(self._log, "transfer_setup_failed", context, line,
                               msg="Marking blocks as invalid")


def make_connector(config: ConnectorConfig, geometry: Geometry, metrics: KvMetrics,
                   faults: FaultSwitches, log: logging.Logger) -> KvConnector:
    """The connector for one engine core; InputError names a bad kv_transfer_config value."""
    settings = settle(config, geometry.plan.data_parallel_size)
    connector: KvConnector = NixlConnector(settings, geometry, metrics, faults, log)
    return connector
