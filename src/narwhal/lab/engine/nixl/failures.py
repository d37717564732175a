"""vLLM's NIXL failure texts, in one place, so the emulator fails the way a real engine does.

The texts follow vLLM v0.29's connector (reference §1.3, §2.5; real-vllm-cpu.md for the dead
prefiller): a handshake error is a RuntimeError raised in the handshake thread and reported
through the connector's structured failure logger; a transfer error is the NIXL binding's
exception. `KvLoadFailed.log_line` carries the exception line (`Type: message`), which is what
the tail of vLLM's traceback shows and what tests and operators grep for.
"""

from __future__ import annotations

import logging
from typing import Any

from narwhal.lab.engine.nixl.api import KvLoadFailed

REMOTE_DISCONNECT = "nixl_cu12._bindings.nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT"
HANDSHAKE_TIMEOUT = "zmq.error.Again: Resource temporarily unavailable"


def hash_mismatch(local: str, remote: str) -> str:
    """vLLM's exact RuntimeError text; it names both hashes and the escape hatch."""
    return (
        "RuntimeError: NIXL compatibility hash mismatch. "
        f"Local: {local}, Remote: {remote}. "
        "Prefill and decode instances have incompatible configurations. This may be due to: "
        "different vLLM versions, models, dtypes, KV cache layouts, attention backends, etc. "
        "Both instances must use identical configurations."
        "Disable this check using --kv-transfer-config "
        "'{\"kv_connector_extra_config\": {\"enforce_handshake_compat\": false}}'"
    )


def engine_id_mismatch(expected: str, received: str) -> str:
    # vLLM's f-strings join without a space after the comma; kept as it prints.
    return (f"RuntimeError: Remote NIXL agent engine ID mismatch. Expected {expected},"
            f"received {received}.")


def tp_not_divisible(local_tp: int, remote_tp: int) -> str:
    if local_tp >= remote_tp:
        return (f"AssertionError: Local tensor parallel size {local_tp} is not divisible by "
                f"remote tensor parallel size {remote_tp}.")
    return (f"AssertionError: Remote tensor parallel size {remote_tp} is not divisible by "
            f"local tensor parallel size {local_tp}.")


def runtime_check(message: str) -> str:
    """A §2.5 runtime check that failed after the hash matched (vLLM asserts)."""
    return f"AssertionError: {message}"


def lease_expired(remote_request_id: str, reason: str) -> str:
    """The consumer's line when the producer no longer holds the blocks it was told to read.

    Real vLLM reads the (possibly reused) blocks anyway and only the producer logs; the
    emulator fails the request instead so a lost lease is visible to the client (documented).
    """
    return (f"RuntimeError: KV blocks for request {remote_request_id} were released by the "
            f"producer before they were read ({reason}): lease expired")


def stale_peer(remote_engine_id: str) -> str:
    return (f"{REMOTE_DISCONNECT} (remote agent of engine {remote_engine_id} restarted; the "
            "cached handshake is stale and is dropped)")


def for_transfer(kind: str, remote_engine_id: str, remote_request_id: str) -> tuple[str, bool]:
    """(exception line, drop the cached handshake?) for a failed read of `kind` (transfer.py).

    Transport failures drop the handshake so the next request re-hand-shakes: a producer that
    came back (same engine_id, new agent) is then reachable again, the upstream recovery.
    """
    if kind == "stale":
        return stale_peer(remote_engine_id), True
    if kind in ("disconnect", "notify"):
        return REMOTE_DISCONNECT, True
    if kind == "expired":
        return lease_expired(remote_request_id, "released when its lease expired"), False
    if kind == "unknown":
        return lease_expired(remote_request_id, "the producer does not know the request"), False
    return f"RuntimeError: the producer refused the read ({kind})", False


def report(log: logging.Logger, failure_type: str, context: dict[str, Any],
           error_line: str, msg: str = "") -> KvLoadFailed:
    """Log like vLLM's `_log_failure` (structured line, then the exception) and build the error."""
    shown = f"{failure_type}. {msg}" if msg else failure_type
    log.error("NIXL transfer failure: %s | Context: %s", shown,
              {"failure_type": failure_type, **context})
    log.error("%s", error_line)
    return KvLoadFailed(error_line)
