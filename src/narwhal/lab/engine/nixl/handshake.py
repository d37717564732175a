"""The consumer's handshake: ask the producer's side channel for each rank it will read from.

Order as in vLLM's `_nixl_handshake`: the compatibility hash is compared *before* the agent
metadata is decoded (so schema skew surfaces as a hash mismatch), then the engine id, then the
runtime pair checks of reference §2.5. Those checks are core/kv's `check_pair`, run on the
remote as its metadata shows it: our own plan with the remote's parallel sizes and reported
block geometry (the hash already proved the model-level factors equal). One handshake per
remote engine id is cached; concurrent first pulls share it; a failure is not cached, so the
next request tries again, as vLLM drops a failed handshake future. A failed handshake is
counted once (vllm:nixl_num_failed_transfers), however many requests waited on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import msgpack
import zmq
import zmq.asyncio

from narwhal.core.kv.capture.sidechannel import HandshakeReply, parse_reply, request_frame
from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.pair import check_pair, tp_ratio
from narwhal.core.kv.versions import VllmFacts
from narwhal.lab.engine.nixl import failures
from narwhal.lab.engine.nixl.api import KvMetrics
from narwhal.lab.engine.nixl.listener import zmq_path
from narwhal.lab.engine.nixl.settings import NixlSettings
from narwhal.lab.engine.nixl.wire import AgentBlob


class HandshakeError(Exception):
    """The handshake failed; `line` is the exception line vLLM's traceback would end with."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


@dataclass(frozen=True)
class RemoteEngine:
    """A producer we completed a handshake with."""

    engine_id: str
    tp_size: int
    pp_size: int
    agent: AgentBlob
    replies: dict[tuple[int, int], HandshakeReply]


def target_ranks(local_tp: int, remote_tp: int, remote_pp: int) -> list[tuple[int, int]]:
    """(pp, tp) ranks of the remote that any local TP rank reads from (TransferTopology §2.4).

    The emulator runs every local TP rank in one process, so it contacts the union.
    """
    ratio = tp_ratio(local_tp, remote_tp)
    if ratio is None:
        raise HandshakeError(failures.tp_not_divisible(local_tp, remote_tp))
    tps: set[int] = set()
    for rank in range(local_tp):
        if ratio > 0:
            tps.add(rank // ratio)
        else:
            tps.update(rank * -ratio + i for i in range(-ratio))
    return [(pp, tp) for pp in range(remote_pp) for tp in sorted(tps)]


def remote_view(local: Geometry, engine_id: str, tp: int, pp: int,
                replies: dict[tuple[int, int], HandshakeReply]) -> Geometry:
    """The remote as core/kv's pair checks need it, built from what its ranks reported."""
    first = min(replies)
    meta = replies[first].as_agent_metadata()
    plan = local.plan.model_copy(update={"name": engine_id, "tensor_parallel_size": tp,
                                         "pipeline_parallel_size": pp})
    stage = local.stages[0].model_copy(update={"metadata": meta})
    return local.model_copy(update={
        "engine": engine_id, "plan": plan, "stages": [stage],
        "mamba_conv_bytes": meta.ssm_sizes[0], "mamba_ssm_bytes": meta.ssm_sizes[1],
        "compatibility_hash": replies[first].compatibility_hash})


def runtime_problems(local: Geometry, remote: RemoteEngine) -> list[str]:
    """§2.5 findings for this pair, as vLLM's assertion texts would read."""
    blocks = {r.metadata["num_blocks"] for r in remote.replies.values()}
    problems = [] if len(blocks) == 1 else [
        f"All remote TP ranks of {remote.engine_id} must report the same num_blocks, got "
        f"{sorted(blocks)}"]
    view = remote_view(local, remote.engine_id, remote.tp_size, remote.pp_size, remote.replies)
    report = check_pair(view, local)
    problems += [f.message for f in report.findings if f.check != "compatibility_hash"]
    return problems


class Handshaker:
    """Per-connector handshake cache keyed by remote engine id."""

    def __init__(self, context: zmq.asyncio.Context, local: Geometry, facts: VllmFacts,
                 settings: NixlSettings, log: logging.Logger, metrics: KvMetrics) -> None:
        self._context = context
        self._metrics = metrics
        self._local = local
        self._facts = facts
        self._settings = settings
        self._log = log
        self._done: dict[str, RemoteEngine] = {}
        self._pending: dict[str, asyncio.Task[RemoteEngine]] = {}

    def cached(self, engine_id: str) -> RemoteEngine | None:
        return self._done.get(engine_id)

    def forget(self, engine_id: str) -> None:
        """Drop a stale handshake so the next request to that engine hand-shakes again."""
        self._done.pop(engine_id, None)

    async def close(self) -> None:
        """Cancel handshakes in flight and wait for them, so their sockets are closed."""
        tasks = list(self._pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pending.clear()
        self._done.clear()

    async def ensure(self, engine_id: str, host: str, port: int, tp_size: int,
                     pp_size: int) -> tuple[RemoteEngine, float]:
        """The remote engine and the seconds this call spent hand-shaking (0.0 when cached)."""
        if (done := self._done.get(engine_id)) is not None:
            return done, 0.0
        start = time.perf_counter()
        task = self._pending.get(engine_id)
        if task is None:
            task = asyncio.create_task(self._run(engine_id, host, port, tp_size, pp_size),
                                       name=f"nixl-handshake-{engine_id}")
            self._pending[engine_id] = task
            # Retrieve the outcome even if every waiter was cancelled (no "never retrieved").
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        remote = await asyncio.shield(task)
        return remote, time.perf_counter() - start

    async def _run(self, engine_id: str, host: str, port: int, tp_size: int,
                   pp_size: int) -> RemoteEngine:
        try:
            try:
                remote = await self._handshake(engine_id, host, port, tp_size, pp_size)
            except (zmq.ZMQError, OSError, ValueError) as exc:  # e.g. an unresolvable host
                raise HandshakeError(f"{type(exc).__name__}: {exc}") from None
        except HandshakeError as exc:
            self._metrics.transfer_failed()
            self._log.error("NIXL transfer failure: handshake_setup_failed | Context: %s",
                            {"failure_type": "handshake_setup_failed", "request_id": None,
                             "engine_id": self._settings.engine_id,
                             "remote_engine_id": engine_id})
            self._log.error("%s", exc.line)
            raise
        finally:
            self._pending.pop(engine_id, None)
        self._done[engine_id] = remote
        return remote

    async def _handshake(self, engine_id: str, host: str, port: int, tp_size: int,
                         pp_size: int) -> RemoteEngine:
        ranks = target_ranks(self._local.tp, tp_size, pp_size)
        path = zmq_path(host, port)
        sock = self._context.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        if path.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        replies: dict[tuple[int, int], HandshakeReply] = {}
        try:
            sock.connect(path)
            for pp, tp in ranks:
                self._log.debug("Querying metadata on path: %s at remote pp rank %s tp rank %s",
                                path, pp, tp)
                await sock.send(request_frame(pp, tp, pp_size, tp_size))
                if not await sock.poll(int(self._settings.handshake_timeout_s * 1000)):
                    raise HandshakeError(failures.HANDSHAKE_TIMEOUT)
                frames: list[bytes] = await sock.recv_multipart()
                replies[(pp, tp)] = self._check_reply(frames, engine_id)
        finally:
            sock.close(linger=0)
        first = replies[ranks[0]]
        try:
            agent = AgentBlob.decode(first.metadata["agent_metadata"])
        except ValueError as exc:
            raise HandshakeError(f"RuntimeError: {exc}") from None
        remote = RemoteEngine(engine_id=engine_id, tp_size=tp_size, pp_size=pp_size,
                              agent=agent, replies=replies)
        problems = runtime_problems(self._local, remote)
        if problems:
            raise HandshakeError(failures.runtime_check(problems[0]))
        return remote

    def _check_reply(self, frames: list[bytes], engine_id: str) -> HandshakeReply:
        """Hash first (two-phase decode, as vLLM), then the metadata and the engine id."""
        try:
            remote_hash = str(msgpack.unpackb(frames[0], raw=False)["compatibility_hash"])
        except Exception as exc:
            raise HandshakeError(
                "RuntimeError: Failed to decode NixlHandshakePayload. This likely indicates an "
                f"incompatibility between connector version. Error: {exc!r}") from None
        local_hash = self._local.compatibility_hash
        if self._settings.enforce_compat and remote_hash != local_hash:
            raise HandshakeError(failures.hash_mismatch(local_hash, remote_hash))
        self._log.info("NIXL compatibility check passed (hash: %s)", remote_hash)
        try:
            reply = parse_reply(frames, self._facts)
        except Exception as exc:
            raise HandshakeError(
                f"RuntimeError: Failed to decode NixlAgentMetadata. Error: {exc}") from None
        if reply.metadata["engine_id"] != engine_id:
            raise HandshakeError(failures.engine_id_mismatch(engine_id,
                                                             reply.metadata["engine_id"]))
        return reply
