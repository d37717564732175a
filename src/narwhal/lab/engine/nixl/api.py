"""The seam between the emulator's HTTP engine and its NIXL side.

The HTTP layer (requests, scheduling, metrics) never touches sockets of the KV path; it calls
one `KvConnector` through this interface. The NIXL side (side channel, handshakes, the TCP
block transfer, leases) never parses HTTP. Both sides are built against these types only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


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

    def valid_remote_params(self, params: dict[str, Any]) -> bool:
        """Consumer side: False for params vLLM would log as `Got invalid KVTransferParams`
        (the request is then computed locally)."""

    async def pull(self, params: dict[str, Any], prompt_token_ids: list[int]) -> PullOutcome:
        """Consumer side: handshake (cached per remote engine), validate, read the blocks over
        TCP, notify the producer. Raises KvLoadFailed with vLLM's message on any failure."""
