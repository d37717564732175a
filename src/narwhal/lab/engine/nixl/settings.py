"""What the NIXL side reads from the engine's configuration, and the fault switches it obeys.

The HTTP side's config class is written separately, so the connector accepts any object with
the few attributes of `ConnectorConfig` (read-only properties, so a frozen dataclass fits) and
settles them once into `NixlSettings`. The kv_transfer_config keys the connector reads are
checked here; a wrong value is an `InputError` naming the key, because a typo in
`kv_lease_duration` would otherwise fall back to 30 s without warning.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from narwhal.core.errors import InputError, Problem

DEFAULT_SIDE_CHANNEL_HOST = "localhost"  # VLLM_NIXL_SIDE_CHANNEL_HOST default
DEFAULT_SIDE_CHANNEL_PORT = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT default since vLLM 0.11.1
DEFAULT_LEASE_SECONDS = 30.0  # kv_connector_extra_config.kv_lease_duration default
HANDSHAKE_TIMEOUT_S = 5.0  # vLLM's initiator sets RCVTIMEO 5000 ms on its REQ socket

PULL_CONNECTORS = ("NixlConnector", "NixlPullConnector")
ROLES = ("kv_producer", "kv_consumer", "kv_both")
BUFFER_DEVICES = ("cuda", "cpu")


class ConnectorConfig(Protocol):
    """The attributes `make_connector` reads from the engine's configuration.

    - kv_transfer_config: the parsed `--kv-transfer-config` JSON object (None is refused: an
      engine without a KV connector has no NIXL side).
    - engine_id: kv_transfer_config.engine_id, else a uuid4 fixed at process start; "" lets
      the connector derive it the same way.
    - side_channel_host: VLLM_NIXL_SIDE_CHANNEL_HOST (default "localhost"); bound and advertised.
    - side_channel_port: VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600), the base port *before* the
      data parallel rank is added.
    - kv_scale: bytes actually moved = real KV bytes x kv_scale (1.0 keeps them real).
    Optional: `data_parallel_rank` (int, default 0) is added to the port, and to the engine id
    when the plan's data_parallel_size > 1.
    """

    @property
    def kv_transfer_config(self) -> Mapping[str, Any] | None: ...
    @property
    def engine_id(self) -> str: ...
    @property
    def side_channel_host(self) -> str: ...
    @property
    def side_channel_port(self) -> int: ...
    @property
    def kv_scale(self) -> float: ...


def data_parallel_rank(config: ConnectorConfig) -> int:
    rank = getattr(config, "data_parallel_rank", 0)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else -1


class FaultSwitches(Protocol):
    """Faults the NIXL side obeys, read at call time so a fault can be set while serving.

    - refuse_handshakes: the side channel receives but never answers (see listener.py).
    - drop_lease_early: `hold` frees the blocks at once; the consumer's pull then fails.
    - recompute_instead_of_pull: `pull` moves nothing and reports 0 tokens (local compute).
    - stale_peer: when it turns on, the producer's NIXL agent "restarts" with a new incarnation
      under the same engine_id, so consumers holding the old handshake fail once.
    """

    @property
    def refuse_handshakes(self) -> bool: ...
    @property
    def drop_lease_early(self) -> bool: ...
    @property
    def recompute_instead_of_pull(self) -> bool: ...
    @property
    def stale_peer(self) -> bool: ...


@dataclass(frozen=True)
class NixlConfig:
    """A ready-made `ConnectorConfig`; `from_env` reads the side channel like vLLM does."""

    kv_transfer_config: Mapping[str, Any] | None
    engine_id: str = ""
    side_channel_host: str = DEFAULT_SIDE_CHANNEL_HOST
    side_channel_port: int = DEFAULT_SIDE_CHANNEL_PORT
    data_parallel_rank: int = 0
    kv_scale: float = 1.0

    @classmethod
    def from_env(cls, kv_transfer_config: Mapping[str, Any] | None, environ: Mapping[str, str],
                 data_parallel_rank: int = 0, kv_scale: float = 1.0) -> NixlConfig:
        raw_port = environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", str(DEFAULT_SIDE_CHANNEL_PORT))
        try:
            port = int(raw_port)
        except ValueError:
            raise InputError("environment", [Problem(
                "VLLM_NIXL_SIDE_CHANNEL_PORT", f"{raw_port!r} is not a port number",
                "set an integer port, e.g. 5600")]) from None
        host = environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", DEFAULT_SIDE_CHANNEL_HOST)
        return cls(kv_transfer_config=kv_transfer_config, side_channel_host=host,
                   side_channel_port=port, data_parallel_rank=data_parallel_rank,
                   kv_scale=kv_scale)


@dataclass(frozen=True)
class NoFaults:
    """Every fault off: the default when the engine has no fault switchboard."""

    refuse_handshakes: bool = False
    drop_lease_early: bool = False
    recompute_instead_of_pull: bool = False
    stale_peer: bool = False


@dataclass(frozen=True)
class NixlSettings:
    """The connector's configuration, settled once at startup."""

    engine_id: str
    role: str
    buffer_device: str
    lease_seconds: float
    enforce_compat: bool
    host: str
    port: int
    kv_scale: float
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _connector_problems(cfg: Mapping[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    name = cfg.get("kv_connector")
    if name not in PULL_CONNECTORS:
        problems.append(Problem("kv_connector", f"{name!r} is not emulated",
                                f"use one of {', '.join(PULL_CONNECTORS)} (pull mode)"))
    role = cfg.get("kv_role")
    if role not in ROLES:
        problems.append(Problem("kv_role", f"{role!r} is not a KV role",
                                f"use one of {', '.join(ROLES)}"))
    device = cfg.get("kv_buffer_device", "cuda")
    if device not in BUFFER_DEVICES:
        problems.append(Problem("kv_buffer_device", f"{device!r} is not supported",
                                f"use one of {', '.join(BUFFER_DEVICES)}"))
    engine_id = cfg.get("engine_id")
    if engine_id is not None and (not isinstance(engine_id, str) or not engine_id):
        problems.append(Problem("engine_id", f"{engine_id!r} is not a non-empty string",
                                "omit it (a random UUID is used) or give a string"))
    return problems


def _extra_problems(extra: Any) -> list[Problem]:
    if not isinstance(extra, Mapping):
        return [Problem("kv_connector_extra_config", f"{extra!r} is not an object",
                        "give a JSON object, e.g. {\"kv_lease_duration\": 30}")]
    problems: list[Problem] = []
    lease = extra.get("kv_lease_duration", DEFAULT_LEASE_SECONDS)
    if not _is_number(lease) or lease <= 0:
        problems.append(Problem("kv_connector_extra_config.kv_lease_duration",
                                f"{lease!r} is not a positive number of seconds",
                                "give seconds > 0 (vLLM's default is 30)"))
    enforce = extra.get("enforce_handshake_compat", True)
    if not isinstance(enforce, bool):
        problems.append(Problem("kv_connector_extra_config.enforce_handshake_compat",
                                f"{enforce!r} is not a boolean", "give true or false"))
    return problems


def _endpoint_problems(config: ConnectorConfig) -> list[Problem]:
    problems: list[Problem] = []
    if not config.side_channel_host:
        problems.append(Problem("VLLM_NIXL_SIDE_CHANNEL_HOST", "is empty",
                                "set an address the peers can reach"))
    rank = data_parallel_rank(config)
    port = config.side_channel_port + rank
    if not 0 < port < 65536 or rank < 0:
        problems.append(Problem("VLLM_NIXL_SIDE_CHANNEL_PORT",
                                f"{config.side_channel_port} + DP rank {rank} is not a TCP port",
                                "use a base port in 1..65535 that leaves room for every DP rank"))
    if not _is_number(config.kv_scale) or not config.kv_scale > 0:
        problems.append(Problem("kv_scale", f"{config.kv_scale!r} is not a positive factor",
                                "use 1.0 for real bytes or a fraction to shrink them"))
    return problems


def settle(config: ConnectorConfig, data_parallel_size: int = 1) -> NixlSettings:
    """Check what the connector reads and fix it for the engine's lifetime."""
    cfg = config.kv_transfer_config
    if cfg is None:
        raise InputError("--kv-transfer-config", [Problem(
            "kv_transfer_config", "is not set, so the engine has no KV connector",
            "pass --kv-transfer-config with kv_connector NixlConnector")])
    extra = cfg.get("kv_connector_extra_config") or {}
    problems = [*_connector_problems(cfg), *_extra_problems(extra), *_endpoint_problems(config)]
    if problems:
        raise InputError("--kv-transfer-config", problems)
    rank = data_parallel_rank(config)
    engine_id = config.engine_id or cfg.get("engine_id") or str(uuid.uuid4())
    if data_parallel_size > 1:  # the engine core appends its DP rank (vLLM §2.1)
        engine_id = f"{engine_id}_dp{rank}"
    return NixlSettings(
        engine_id=engine_id, role=cfg["kv_role"], buffer_device=cfg.get("kv_buffer_device",
                                                                        "cuda"),
        lease_seconds=float(extra.get("kv_lease_duration", DEFAULT_LEASE_SECONDS)),
        enforce_compat=extra.get("enforce_handshake_compat", True),
        host=config.side_channel_host, port=config.side_channel_port + rank,
        kv_scale=float(config.kv_scale))
