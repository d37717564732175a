"""The seam between the emulator's HTTP engine and its NIXL side.

The HTTP layer (requests, scheduling, metrics) never touches sockets of the KV path; it calls
one `KvConnector` through this interface. The NIXL side (side channel, handshakes, the TCP
block transfer, leases) never parses HTTP. Both sides are built against these types only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

# What a consumer does with `do_remote_prefill` params (vLLM 0.32's scheduler, nixl/params.py):
# pull the KV; log `Got invalid KVTransferParams` and wait for a load that never starts; or
# assert, which kills the engine core.
RemoteVerdict = Literal["pull", "invalid", "engine_dead"]


class KvLoadFailed(Exception):
    """The consumer could not load remote KV (handshake refused, hash mismatch, peer gone,
    lease expired). `log_line` is what vLLM logs for the same cause; the HTTP layer fails the
    request with vLLM's error shape (kv_load_failure_policy "fail")."""

    def __init__(self, log_line: str) -> None:
        super().__init__(log_line)
        self.log_line = log_line


@dataclass(frozen=True)
class PullOutcome:
    """What one consumer-side pull moved; feeds the vllm:nixl_* metrics."""

    tokens: int  # prompt tokens whose KV arrived (counted as source=external_kv_transfer)
    bytes_moved: int  # real bytes read over the fabric
    seconds: float  # wall time of the transfer itself (after the handshake)
    post_seconds: float  # time to issue the transfer (handshake excluded)
    descriptors: int  # blocks x regions read
    handshake_seconds: float  # 0.0 when a cached handshake was reused


class KvMetrics(Protocol):
    """The metric hooks the NIXL side reports into (implemented by the HTTP side's registry)."""

    def transfer_done(self, outcome: PullOutcome) -> None: ...
    def transfer_failed(self) -> None: ...
    def notification_failed(self) -> None: ...
    def lease_expired(self, count: int) -> None: ...
    def notification_after_expiry(self) -> None: ...
    def kv_held(self, blocks: int, capacity: int) -> None: ...


class KvConnector(Protocol):
    """One engine's NIXL connector (pull mode), emulated."""

    engine_id: str
    side_channel_host: str
    side_channel_port: int

    async def start(self) -> None:
        """Bind the side channel and the block server; log vLLM's startup lines."""

    async def stop(self) -> None: ...

    def hold(self, request_id: str, prompt_token_ids: list[int]) -> dict[str, Any]:
        """Producer side, after a `do_remote_decode` prefill: keep the prompt's blocks under a
        lease and return the response's `kv_transfer_params` exactly as vLLM's pull mode does."""

    def remote_verdict(self, params: dict[str, Any]) -> RemoteVerdict:
        """Consumer side, before anything moves: what vLLM's scheduler does with these params."""

    async def pull(self, params: dict[str, Any], prompt_token_ids: list[int],
                   request_id: str = "") -> PullOutcome:
        """Consumer side (verdict "pull"): handshake (cached per remote engine), validate, read
        the blocks over TCP, notify the producer. Raises KvLoadFailed with vLLM's message on
        any failure; `request_id` is the consumer's own id, for the failure log."""

    async def release(self, params: dict[str, Any], request_id: str) -> None:
        """Consumer side, after a failed load: what vLLM does for a request that finishes with
        `do_remote_prefill` still set, i.e. hand-shake again if needed and tell the producer to
        free its blocks. Failures are logged and counted, never raised."""
