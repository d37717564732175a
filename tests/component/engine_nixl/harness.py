"""Two emulated connectors on loopback, started in one event loop and always stopped."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from narwhal.core.kv.geometry import Geometry
from narwhal.lab.engine.nixl.connector import NixlConnector
from narwhal.lab.engine.nixl.settings import NixlConfig, settle
from narwhal.lab.ports import free_port
from narwhal.node.nixl_probe import ProbeTarget
from tests.unit.engine_nixl.helpers import Lines, Metrics, Switches, recorded_logger, tiny

HOST = "127.0.0.1"


@dataclass
class Engine:
    """One started connector with what a test inspects: its log lines, metrics and faults."""

    connector: NixlConnector
    lines: Lines
    metrics: Metrics
    faults: Switches = field(default_factory=Switches)
    rebind: Callable[[], NixlConnector] | None = None

    @property
    def geometry(self) -> Geometry:
        return self.connector.geometry


def engine(name: str, geometry: Geometry | None = None, *, role: str = "kv_both",
           extra: dict[str, Any] | None = None, engine_id: str | None = None,
           kv_scale: float = 1.0, handshake_timeout_s: float = 1.0,
           port: int | None = None) -> Engine:
    kv: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": role,
                          "kv_connector_extra_config": extra or {}}
    if engine_id:
        kv["engine_id"] = engine_id
    log, lines = recorded_logger(name)
    metrics, faults = Metrics(), Switches()

    def build(chosen: int) -> NixlConnector:
        settings = settle(NixlConfig(kv, side_channel_host=HOST,
                                     side_channel_port=chosen, kv_scale=kv_scale))
        # A short initiator timeout keeps failure tests quick; vLLM's is 5 s (settings default).
        settings = dataclasses.replace(settings, handshake_timeout_s=handshake_timeout_s)
        return NixlConnector(settings, geometry or tiny(), metrics, faults, log)

    # A port the harness picked may be taken between the pick and the bind by any other
    # socket on the machine; only such a port is picked again.
    rebind = None if port else (lambda: build(free_port()))
    return Engine(build(port or free_port()), lines, metrics, faults, rebind)


async def _start(e: Engine, tries: int = 3) -> None:
    for attempt in range(tries):
        try:
            await e.connector.start()
            return
        except RuntimeError as exc:
            if e.rebind is None or "Address already in use" not in str(exc) \
                    or attempt == tries - 1:
                raise
            e.connector = e.rebind()


@asynccontextmanager
async def started(*engines: Engine) -> AsyncIterator[None]:
    try:
        for e in engines:
            await _start(e)
        yield
    finally:
        for e in engines:
            await e.connector.stop()


def run(scenario: Callable[[], Awaitable[None]], limit_s: float = 25.0) -> None:
    """Run one async scenario with a hard time bound."""
    asyncio.run(asyncio.wait_for(scenario(), limit_s))


def target(e: Engine) -> ProbeTarget:
    """Our side-channel probe's view of an emulated engine."""
    g = e.geometry
    return ProbeTarget(alias="emulator", host=HOST, port=e.connector.side_channel_port,
                       pp_size=g.pp, tp_size=g.tp, vllm_version=g.plan.vllm_version)


PROMPT = list(range(306))
