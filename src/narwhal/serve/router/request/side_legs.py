"""The legs beside a request's two: a one-shot /tokenize or /detokenize for a client, the
count of a prompt before its legs, and the KV release a refused decode leg leaves behind.

Each is a single exchange with one engine whose answer only informs (a count, a log line) or
is passed on as it is; none changes a request's bookings or decision, so they live apart from
the proxy's leg chain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from narwhal.serve.router.front.front import ClientConnection
from narwhal.serve.router.front.responses import error_body
from narwhal.serve.router.jsonio import dumps, loads
from narwhal.serve.router.observe.metrics import RouterMetrics
from narwhal.serve.router.request.call import Call
from narwhal.serve.router.request.continuation import Counts, counts_from, tokenize_body
from narwhal.serve.router.request.deadlines import Deadlines
from narwhal.serve.router.request.legs import (
    OK,
    Collector,
    LegFailed,
    LegTimedOut,
    dispatch,
    exchange,
    request_bytes,
)
from narwhal.serve.router.request.upstream import EngineUnreachable
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.settings import Limits

_log = logging.getLogger("narwhal.serve.router.request.side_legs")


async def forward_once(conn: ClientConnection, engine: Engine, path: bytes, body: bytes,
                       keep_alive: bool, limits: Limits, deadlines: Deadlines,
                       metrics: RouterMetrics) -> None:
    """A client's one-shot request answered by `engine`; an engine's 5xx or failure is the
    router's 502."""
    req = request_bytes(b"POST", path, engine.spec.host_header, b"", body,
                        bearer=engine.spec.bearer)
    try:
        status, payload = await exchange(engine.pool, req, limits.prefill_timeout_s, deadlines)
    except (EngineUnreachable, LegFailed, LegTimedOut) as exc:
        metrics.request("tokenize", "engine_unreachable")
        conn.respond(502, error_body(502, f"engine {engine.id} failed: "
                                     f"{exc or type(exc).__name__}",
                                     code="engine_unreachable"), b"", keep_alive)
        return
    metrics.request("tokenize", "ok" if status == 200 else "engine_rejected")
    if status >= 500:
        payload = error_body(502, f"engine {engine.id} answered {status}", code="engine_error")
        status = 502
    conn.respond(status, payload, b"", keep_alive)


async def count_prompt(call: Call, engine: Engine, limits: Limits, deadlines: Deadlines) -> None:
    """Exact prompt length from the engine's /tokenize, when it answers."""
    req = request_bytes(b"POST", b"/tokenize", engine.spec.host_header, b"",
                        call.tokenize_body(), bearer=engine.spec.bearer)
    try:
        status, payload = await exchange(engine.pool, req, limits.prefill_timeout_s, deadlines)
        if status == 200:
            count = loads(payload).get("count")
            if type(count) is int:
                call.learned(count)
    except (EngineUnreachable, LegFailed, LegTimedOut, ValueError, AttributeError):
        pass  # the prefill leg that follows meets the same engine and reports properly


async def count_continued(call: Call, engine: Engine, text: str, limits: Limits,
                          deadlines: Deadlines) -> tuple[Counts, list[int] | None] | None:
    """The prompt's tokens and the answer's so far, counted by `engine` (whose tokenizer the
    continued request meets); None when it does not answer."""
    if call.prompt_tokens is None:
        await count_prompt(call, engine, limits, deadlines)
    prompt = call.prompt_tokens
    if prompt is None:
        return None
    req = request_bytes(b"POST", b"/tokenize", engine.spec.host_header, b"",
                        dumps(tokenize_body(call.body, call.chat, text)),
                        bearer=engine.spec.bearer)
    try:
        status, payload = await exchange(engine.pool, req, limits.prefill_timeout_s, deadlines)
        answer = loads(payload) if status == 200 else None
    except (EngineUnreachable, LegFailed, LegTimedOut, ValueError):
        return None
    return counts_from(call.body, prompt, answer) if isinstance(answer, dict) else None


def release_kv(call: Call, engine: Engine, kv: bytes, limits: Limits, deadlines: Deadlines,
               metrics: RouterMetrics,
               spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
    """Have `engine` take the KV the producer holds for `call` in a one-token leg, so the
    producer frees it now rather than when its lease expires; the result is only logged."""
    metrics.kv_release("sent")

    def released(leg: Collector) -> None:
        deadlines.discard(leg)
        if leg.result == OK and leg.status == 200:
            metrics.kv_release("ok")
            return
        metrics.kv_release("failed")
        _log.warning("request %s: engine %s did not take the KV the refused decode leg left "
                     "(%s); the producer frees it when its lease expires",
                     call.request_id.decode("ascii", "replace"), engine.id,
                     leg.reason or f"answered {leg.status}")

    leg = Collector(released, time.monotonic() + limits.first_token_timeout_s)
    req = request_bytes(b"POST", call.path, engine.spec.host_header, call.leg_id + b"-release",
                        call.release_body(kv), bearer=engine.spec.bearer)
    dispatch(engine.pool, req, leg, deadlines, spawn)
