"""Attestation binding: an engine is placed only while its sidecar vouches for the live process.

For every engine the fleet gives an `attestation_url` and `contract` (Gate E), the router reads
the sidecar at startup and on every sweep. It holds the engine out of placement, with reason
`attestation` and the sidecar's own words, when the sidecar answers 503 (the engine process or
its layout changed), when the document is not the one the fleet's contract names (another
digest or compatibility hash: the fleet was attested against another process), or when the
sidecar cannot be read. The engine is released only when its sidecar vouches again for the
contract. The profile binding (generation.py) never lifts this hold. Nothing here runs on the
request path.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from narwhal.core.fleet import EngineContract, EngineEntry
from narwhal.core.sidecar_answer import read_answer
from narwhal.serve.router.scheduling.engines import Engine

_log = logging.getLogger("narwhal.serve.router.control.attestation")
HELD = "attestation"
MAX_DOCUMENT_BYTES = 1 << 20


@dataclass(frozen=True)
class Attestation:
    url: str
    contract: EngineContract


def attested_engines(engines: Iterable[EngineEntry]) -> dict[str, Attestation]:
    """Each engine of a Gate E fleet document with its sidecar and contract."""
    return {e.id: Attestation(e.attestation_url, e.contract) for e in engines
            if e.attestation_url is not None and e.contract is not None}


def judge(status: int, body: Any, contract: EngineContract) -> str:
    """Why the sidecar's answer does not vouch for the contract ("" when it does)."""
    return read_answer(status, body, contract.attestation_digest,
                       contract.compatibility_hash).reason


class Attestor:
    def __init__(self, engines: Sequence[Engine], attestations: Mapping[str, Attestation],
                 timeout_s: float, interval_s: float,
                 rebind: Callable[[Engine], None] | None = None) -> None:
        self.engines = tuple(e for e in engines if e.id in attestations)
        self.attestations = dict(attestations)
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.rebind = rebind  # the profile binding, once an attestation hold lifts
        self.holds = 0
        self.last: dict[str, str] = {}  # engine id -> the last reason ("" when vouched for)
        self._session: aiohttp.ClientSession | None = None  # one for every sweep

    async def _read(self, session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
        async with session.get(url, allow_redirects=False) as reply:
            data = await reply.content.read(MAX_DOCUMENT_BYTES + 1)
            if len(data) > MAX_DOCUMENT_BYTES:
                return reply.status, None
            try:
                return reply.status, json.loads(data)
            except ValueError:
                return reply.status, None

    async def check(self, session: aiohttp.ClientSession, engine: Engine) -> None:
        a = self.attestations[engine.id]
        try:
            status, body = await self._read(session, a.url)
            why = judge(status, body, a.contract)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            why = f"the sidecar cannot be read ({type(exc).__name__}: {exc})"
        self.last[engine.id] = why
        if why:
            if engine.held != HELD:
                self.holds += 1
                _log.warning("engine %s held out (attestation): %s", engine.id, why)
            engine.held, engine.held_detail, engine.profile = HELD, why, None
        elif engine.held == HELD:
            _log.warning("engine %s attested again", engine.id)
            engine.held, engine.held_detail = "", ""
            if self.rebind is not None:
                self.rebind(engine)

    async def sweep(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        session = self._session
        await asyncio.gather(*(self.check(session, e) for e in self.engines))

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                await self.sweep()
        finally:
            if self._session is not None:
                await self._session.close()

    def state(self) -> dict[str, Any]:
        return {e.id: {"url": self.attestations[e.id].url, "vouched": not self.last.get(e.id),
                       "reason": self.last.get(e.id) or None} for e in self.engines}
