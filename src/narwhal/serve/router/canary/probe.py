"""The canary's loop: each ordered producer -> consumer pair probed in turn, once per interval.

A probe is the router's own split request with the reference prompt: a one-token prefill leg
on the producer that keeps the KV, then a greedy decode leg on the consumer with the
producer's kv_transfer_params (and logprobs where the reference has them). Each probe carries
a fresh `cache_salt`, so neither engine answers from a prefix cache: the consumer must pull
the whole prompt. How much it pulled is read from its own answer
(`usage.prompt_tokens_details.cached_tokens`, with --enable-prompt-tokens-details), else from
its `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}` counter around the
probe (which other requests' pulls can also move on a busy engine). Only the primary probes:
a standby's probes would double the cost and it places nothing.

The canary probes only while the router serves: a probe is sent when a client request is in
flight or one ended since the last probe. An idle fleet has no request to protect, and its
engines must stay idle for Gate D's fabric samples, which count any request as load; the
first requests after an idle spell are probed for within one probe gap.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from narwhal.serve.router.cache.view import cached_tokens
from narwhal.serve.router.canary import judge as J
from narwhal.serve.router.canary.holds import PairHolds
from narwhal.serve.router.jsonio import dumps, loads
from narwhal.serve.router.request.deadlines import Deadlines
from narwhal.serve.router.request.legs import LegFailed, LegTimedOut, exchange, request_bytes
from narwhal.serve.router.request.upstream import EngineUnreachable
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.settings import CanarySettings

_log = logging.getLogger("narwhal.serve.router.canary")


def pairs_of(engines: list[Engine]) -> list[tuple[Engine, Engine]]:
    """Every ordered pair a split request can take: a prefill engine, another decode engine."""
    return [(p, d) for p in engines if p.spec.can_prefill
            for d in engines if d.spec.can_decode and d is not p]


def _answer(status: int, payload: bytes) -> dict[str, Any]:
    try:
        body = loads(payload)
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"error": {"message": payload[:200].decode(
        "utf-8", "replace")}} if status != 200 else {}


class Canary:
    """Probes every pair in turn while this router is the primary."""

    def __init__(self, settings: CanarySettings, model: str, engines: list[Engine],
                 holds: PairHolds, deadlines: Deadlines, timeout_s: float,
                 primary: Callable[[], bool], traffic: Callable[[], tuple[int, int]]) -> None:
        self.settings = settings
        self.ref = settings.reference
        self.model = model
        self.engines = engines
        self.holds = holds
        self.deadlines = deadlines
        self.timeout_s = timeout_s
        self.primary = primary
        self.traffic = traffic  # (client requests ended, in flight) so far
        self._served_at_probe = 0
        self.started = time.monotonic()
        self.probes = 0
        self.engine_seconds = 0.0  # the legs' time on the engines, for the cost

    async def run(self) -> None:
        turn = 0
        due = time.monotonic()
        while True:
            pairs = pairs_of(self.engines)
            # probes start on a fixed cadence, so a pair's period is `interval_s` however
            # long each probe takes (one that overran starts the next at once)
            due = max(due + self.settings.interval_s / max(len(pairs), 1), time.monotonic())
            await asyncio.sleep(due - time.monotonic())
            if not pairs or not self.primary() or not self._serving():
                continue
            producer, consumer = pairs[turn % len(pairs)]
            turn += 1
            if not (producer.placeable and consumer.placeable):
                continue  # an ejected or held engine is health's and binding's business
            try:
                verdict = await self.probe(producer, consumer)
            except Exception:  # a bug must not end the loop
                _log.exception("canary probe %s->%s: unexpected error", producer.id,
                               consumer.id)
                continue
            self.holds.record(producer.id, consumer.id, verdict)
            if not verdict.ok:
                _log.warning("kv canary: pair %s->%s %s: %s", producer.id, consumer.id,
                             verdict.kind, verdict.detail)

    def _serving(self) -> bool:
        """Whether a client request is in flight or ended since the last probe."""
        served, inflight = self.traffic()
        if inflight == 0 and served == self._served_at_probe:
            return False
        self._served_at_probe = served
        return True

    async def _post(self, engine: Engine, body: dict[str, Any],
                    leg: bytes) -> tuple[int, dict[str, Any]]:
        req = request_bytes(b"POST", b"/v1/completions", engine.spec.host_header, leg,
                            dumps(body), bearer=engine.spec.bearer)
        t0 = time.monotonic()
        try:
            status, payload = await exchange(engine.pool, req, self.timeout_s, self.deadlines)
        finally:
            self.engine_seconds += time.monotonic() - t0
        return status, _answer(status, payload)

    async def _external(self, engine: Engine) -> float | None:
        req = request_bytes(b"GET", b"/metrics", engine.spec.host_header, b"", None,
                            bearer=engine.spec.bearer)
        status, payload = await exchange(engine.pool, req, self.timeout_s, self.deadlines)
        return J.external_kv_tokens(payload) if status == 200 else None

    async def probe(self, producer: Engine, consumer: Engine) -> J.Verdict:
        """One probe of the pair: its verdict (never raises for an engine's failure)."""
        self.probes += 1
        salt = f"narwhal-canary-{secrets.token_hex(8)}"
        leg = salt.encode()
        common = {"model": self.model, "prompt": self.ref.prompt, "temperature": 0,
                  "ignore_eos": True, "stream": False, "cache_salt": salt}
        try:
            status, first = await self._post(producer, {
                **common, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
                leg + b"-prefill")
            kv = first.get("kv_transfer_params")
            if status != 200 or not isinstance(kv, dict) or not kv:
                return J.Verdict(J.FAILED, f"the producer answered HTTP {status} with "
                                           f"{'no kv_transfer_params' if status == 200 else first}")
            before = await self._external(consumer)
            decode = {**common, "max_tokens": self.ref.max_tokens, "kv_transfer_params": kv,
                      **({"logprobs": 1} if self.ref.token_logprobs is not None else {})}
            status, answer = await self._post(consumer, decode, leg)
            after = await self._external(consumer)
        except (EngineUnreachable, LegFailed, LegTimedOut) as exc:
            return J.Verdict(J.FAILED, f"a leg failed: {exc or type(exc).__name__}")
        cached = cached_tokens(answer.get("usage"))
        pulled = float(cached) if cached is not None else None
        if pulled is None and before is not None and after is not None:
            pulled = after - before
        return J.judge(self.ref, status, answer, pulled, self.settings.logprob_tolerance)

    def state(self) -> dict[str, Any]:
        """The canary's settings, its cost so far and every pair's last verdict."""
        pairs = len(pairs_of(self.engines))
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {"interval_s": self.settings.interval_s, "pairs_probed_in_turn": pairs,
                "while": "serving",
                "probes": self.probes,
                "probes_per_hour": round(pairs * 3600 / self.settings.interval_s, 1),
                "engine_time_share": round(self.engine_seconds / (elapsed * max(
                    len(self.engines), 1)), 6),
                "pairs": self.holds.state()}
