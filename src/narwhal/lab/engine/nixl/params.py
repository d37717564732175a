"""`kv_transfer_params` as vLLM 0.32's pull mode writes them (producer) and reads them (consumer).

The producer's object has exactly the keys, order and types of the real reply recorded in
real-vllm-cpu.md. The consumer sorts a `do_remote_prefill` request the way vLLM 0.32's
`NixlPullConnectorScheduler.update_state_after_alloc` does (`remote_verdict`), which looks only
at which keys are there:

    remote_block_ids missing or empty     the scheduler asserts and the engine core dies
    a remote_engine_id/request_id/host/port key missing
                                          `Got invalid KVTransferParams`; the request waits
                                          for a KV load that never starts
    all five present                      the worker pulls; `parse_remote` then reads the
                                          values, and values it cannot use fail the load
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from narwhal.lab.engine.nixl.api import RemoteVerdict

MAX_PARALLEL = 1024  # bound on tp_size/pp_size: each remote rank costs a handshake request
REQUIRED = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
            "remote_port")
ADDRESS_KEYS = REQUIRED[1:]  # the keys vLLM checks by presence once block ids are given


def producer_params(*, engine_id: str, host: str, port: int, tp_size: int, pp_size: int,
                    block_ids: list[list[int]], request_id: str,
                    num_tokens: int) -> dict[str, Any]:
    """The response's `kv_transfer_params` after a `do_remote_decode` prefill."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(group) for group in block_ids],
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": tp_size,
        "dcp_size": 1,
        "pp_size": pp_size,
        "remote_num_tokens": num_tokens,
        "remote_blocks_expiry_time": None,
        "transfer_mode": "pull",
        "remote_prefill_cached_tokens": 0,
    }


@dataclass(frozen=True)
class RemoteParams:
    """What the consumer needs from the params to hand-shake and read."""

    engine_id: str
    request_id: str
    host: str
    port: int
    block_ids: list[list[int]]
    tp_size: int
    pp_size: int


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size(params: dict[str, Any], key: str) -> int | None:
    """tp_size/pp_size: absent or null means 1 (vLLM's silent default); else an int >= 1."""
    value = params.get(key)
    if value is None:
        return 1
    return value if _int(value) and 1 <= value <= MAX_PARALLEL else None


def remote_verdict(params: Any) -> RemoteVerdict:
    """What vLLM 0.32 does with a consumer's `do_remote_prefill` params (module docstring)."""
    if not isinstance(params, dict):
        return "invalid"
    if not params.get("remote_block_ids"):
        return "engine_dead"
    if any(key not in params for key in ADDRESS_KEYS):
        return "invalid"
    return "pull"


def parse_remote(params: Any) -> RemoteParams | None:
    """The consumer's view of the params, or None for params vLLM would not use."""
    if not isinstance(params, dict) or any(k not in params for k in REQUIRED):
        return None
    blocks = params["remote_block_ids"]
    if not isinstance(blocks, list) or not all(
            isinstance(g, list) and all(_int(b) and b >= 0 for b in g) for g in blocks):
        return None
    texts = [params[k] for k in ("remote_engine_id", "remote_request_id", "remote_host")]
    if not all(isinstance(t, str) and t for t in texts):
        return None
    port = params["remote_port"]
    tp, pp = _size(params, "tp_size"), _size(params, "pp_size")
    if not (_int(port) and 0 < port < 65536) or tp is None or pp is None:
        return None
    return RemoteParams(engine_id=texts[0], request_id=texts[1], host=texts[2], port=port,
                        block_ids=[list(g) for g in blocks], tp_size=tp, pp_size=pp)
