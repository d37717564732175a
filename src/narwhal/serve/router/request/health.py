"""Engine health: eject after a streak of connection failures, readmit on a good /health.

Three signals feed it: legs report connection failures and successes; a leg that timed out
asks for a probe now rather than counting as a failure (a slow engine is not a dead one); and
a periodic sweep probes every ejected engine and every engine that carried no traffic since
the last sweep, so a dead engine is found even when the fleet is idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from narwhal.serve.router.jsonio import loads
from narwhal.serve.router.request.deadlines import Deadlines
from narwhal.serve.router.request.legs import LegFailed, LegTimedOut, exchange, request_bytes
from narwhal.serve.router.request.upstream import EngineUnreachable
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.settings import HealthPolicy

_log = logging.getLogger("narwhal.serve.router.request.health")


class Health:
    def __init__(self, engines: Sequence[Engine], policy: HealthPolicy, deadlines: Deadlines) -> None:
        self.engines = tuple(engines)
        self.policy = policy
        self.deadlines = deadlines
        self._probing: set[Engine] = set()
        self._tasks: set[asyncio.Task[bool]] = set()

    # -- signals from legs ------------------------------------------------------------------
    def ok(self, engine: Engine) -> None:
        engine.fail_streak = 0
        engine.last_ok = time.monotonic()

    def failed(self, engine: Engine, reason: str) -> None:
        engine.fail_streak += 1
        if not engine.ejected and engine.fail_streak >= self.policy.eject_after_failures:
            engine.ejected = True
            engine.ejected_reason = f"{engine.fail_streak} consecutive failures, last: {reason}"
            engine.ejections += 1
            _log.warning("engine %s ejected: %s", engine.id, engine.ejected_reason)
        elif engine.ejected and not engine.ejections:  # held out since start: say why now
            engine.ejected_reason = f"not admitted: {reason}"

    def suspect(self, engine: Engine) -> None:
        """A leg timed out: probe the engine now instead of waiting for the sweep."""
        if engine in self._probing:
            return
        task = asyncio.get_running_loop().create_task(self.probe(engine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- probing ----------------------------------------------------------------------------
    async def probe(self, engine: Engine) -> bool:
        """GET /health once; 200 readmits an ejected engine, anything else counts a failure."""
        if engine in self._probing:
            return not engine.ejected
        self._probing.add(engine)
        try:
            req = request_bytes(b"GET", b"/health", engine.spec.host_header, b"", None,
                                bearer=engine.spec.bearer)
            try:
                status, _ = await exchange(engine.pool, req, self.policy.probe_timeout_s,
                                           self.deadlines)
                reason = f"/health answered {status}"
            except (EngineUnreachable, LegFailed, LegTimedOut) as exc:
                status, reason = 0, f"/health: {exc or type(exc).__name__}"
            if status == 200 and (engine.ejected or not engine.context_len):
                # a restarted engine may hold another context, or refuse the router's key
                refused = await self._read_context(engine)
                if refused:
                    status, reason = 0, refused
            if status == 200:
                if engine.ejected and engine.ejections:
                    _log.warning("engine %s readmitted: /health is 200", engine.id)
                engine.ejected = False
                engine.ejected_reason = ""
                self.ok(engine)
                return True
            self.failed(engine, reason)
            return False
        finally:
            self._probing.discard(engine)

    async def _read_context(self, engine: Engine) -> str:
        """max_model_len of the engine's served model from GET /v1/models (vLLM's cards carry
        it); left 0, and the engines left to judge each request, when it cannot be read.
        Returns why the engine is unusable when it refuses the router's engine key (401/403 on
        a /v1 route: every leg would be refused too), else ""."""
        req = request_bytes(b"GET", b"/v1/models", engine.spec.host_header, b"", None,
                            bearer=engine.spec.bearer)
        try:
            status, payload = await exchange(engine.pool, req, self.policy.probe_timeout_s,
                                             self.deadlines)
            if status in (401, 403):
                engine.context_len = 0
                return (f"/v1/models answered {status}: the engine refuses the router's engine "
                        "key (fleet: engine_auth.key_file must hold the engine's VLLM_API_KEY)")
            cards = loads(payload).get("data") if status == 200 else None
            found = [c.get("max_model_len") for c in cards or () if isinstance(c, dict)]
            sizes = [n for n in found if type(n) is int and n > 0]
            engine.context_len = min(sizes) if sizes else 0
        except (EngineUnreachable, LegFailed, LegTimedOut, ValueError, AttributeError):
            engine.context_len = 0
        return ""

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(e) for e in self.engines))

    def due(self, now: float) -> list[Engine]:
        """Engines the sweep should probe: ejected ones, and idle ones with no recent success."""
        horizon = now - self.policy.probe_interval_s
        return [e for e in self.engines
                if e.ejected or (e.outstanding == 0 and e.last_ok < horizon)]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.policy.probe_interval_s)
            due = self.due(time.monotonic())
            if due:
                await asyncio.gather(*(self.probe(e) for e in due))
