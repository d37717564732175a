"""The two-leg data path: a one-token prefill leg, the KV handoff, a streamed decode leg.

Per request: place both legs (the `EngineChooser` seam); if they land on one engine send one
plain request; otherwise send the prefill leg, take the producer's `kv_transfer_params` as
the engine returned them and attach them to the decode leg. The decode leg is retried on
another engine only while no byte of it reached the client.

The path is a chain of continuations, not a task: each leg's sink calls the next stage from
the socket callback that ended the leg (see legs.py). Every stage runs under `_guard`, so a
bug still answers the client and still ends the call; every accepted call ends in `_finish`
exactly once: one journal row, one outcome count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from narwhal.serve.router.front.front import ClientConnection
from narwhal.serve.router.front.responses import (
    engine_error_body,
    engine_text,
    error_body,
    stream_head,
)
from narwhal.serve.router.jsonio import dumps, loads
from narwhal.serve.router.observe.journal import Journal
from narwhal.serve.router.observe.metrics import RouterMetrics
from narwhal.serve.router.request import continuation as C
from narwhal.serve.router.request import decisions as D
from narwhal.serve.router.request import relay as R
from narwhal.serve.router.request.call import Call
from narwhal.serve.router.request.context_fit import context_of, context_overflow, needs_count
from narwhal.serve.router.request.deadlines import (
    Deadlines,
    handoff_deadline_s,
    leg_deadline_s,
    stall_s,
)
from narwhal.serve.router.request.health import Health
from narwhal.serve.router.request.legs import (
    FAILED,
    OK,
    Collector,
    dispatch,
    request_bytes,
)
from narwhal.serve.router.request.reassemble import StreamError, reassemble
from narwhal.serve.router.request.side_legs import (
    count_continued,
    count_prompt,
    forward_once,
    release_kv,
)
from narwhal.serve.router.request.token_estimate import BytesPerToken
from narwhal.serve.router.scheduling.choosers import EngineChooser
from narwhal.serve.router.scheduling.engines import Engine, Refusal
from narwhal.serve.router.settings import Limits

_log = logging.getLogger("narwhal.serve.router.request.proxy")
# How a broken stream settles when it cannot be continued: its row, and the error event the
# relay owed the client before the continuation was tried.
Settled = tuple[D.Decision, tuple[str, str] | None]
# A decode relay's result as the decision table names leg ends (an engine status is split by
# its class where it is read).
_DECODE_END = {R.FAILED_BEFORE: D.FAILED_BEFORE, R.TIMEOUT_BEFORE: D.TIMEOUT_BEFORE,
               R.FAILED_MID: D.FAILED_MID, R.TIMEOUT_MID: D.TIMEOUT_MID,
               R.CLIENT_GONE: D.CLIENT_GONE, R.CUT: D.CUT}


class Proxy:
    """Runs accepted calls to completion; counts them while they run."""

    def __init__(self, limits: Limits, chooser: EngineChooser, health: Health,
                 metrics: RouterMetrics, journal: Journal, deadlines: Deadlines) -> None:
        self.limits = limits
        self.chooser = chooser
        self.bookings = chooser.bookings  # told every leg's events (bookings.py)
        self.health = health
        self.metrics = metrics
        self.journal = journal
        self.deadlines = deadlines
        self.inflight = 0
        self.served = 0
        self.estimator = BytesPerToken()  # prompt tokens per body byte, learned (token_estimate.py)
        self.cache: Any = None  # router/cache/view.CacheView when the fleet asks for it
        self.holds: Any = None  # router/canary/holds.PairHolds when the fleet has kv_canary
        # Prefill legs waiting in the router's line for an engine (`Engine.prefill_line`), each
        # booked on its queue when placed, sent in the order placed as its legs answer.
        self._lines: dict[Engine, deque[tuple[Call, Collector, bytes]]] = {}
        # (producer, consumer) ids that have handed KV off since either last failed: a pair's
        # first handoff also makes its connection, which no transfer budget covers
        self._warm: set[tuple[str, str]] = set()
        self.cutting = False  # set when shutdown cuts requests that outlived the drain
        self._tasks: set[asyncio.Task[None]] = set()
        self._calls: set[Call] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, conn: ClientConnection, call: Call) -> None:
        self.inflight += 1
        self._calls.add(call)
        self._idle.clear()
        conn.watcher = call
        cache = self.cache
        if cache is not None and cache.off_loop(call):
            self._spawn(self._tokenize_off_loop(call))
        else:
            self._guard(call, self._place)

    def cut_all(self) -> int:
        """End every call still in flight (shutdown's drain bound ran out); returns how many."""
        self.cutting = True
        calls = list(self._calls)
        for call in calls:
            call.cut()
        return len(calls)

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Background work off the common path (opening a connection, /tokenize)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _guard(self, call: Call, stage: Callable[..., None], *args: Any) -> None:
        try:
            stage(call, *args)
        except Exception as exc:  # a bug: answer, journal it, keep serving
            _log.exception("request %s: unexpected error (this is a bug)", call.request_id)
            if not call.finished:
                if call.decision is not None:
                    self._finish(call)
                else:
                    self._settle(call, D.ROUTER_ERROR, detail=type(exc).__name__)

    def _finish(self, call: Call) -> None:
        if call.finished:
            return
        call.finished = True
        self.bookings.finished(call)
        decision = call.decision
        assert decision is not None
        if self.cutting:
            call.decision = decision = D.at_shutdown(decision)
        outcome = decision.outcome
        assert outcome is not None
        self.inflight -= 1
        self.served += 1
        self._calls.discard(call)
        if call.placement is not None:
            self.chooser.finished(call)
        self.metrics.settled(call.route, outcome, call.ttft_s, call.tpot_s, call.handoff_s)
        self.journal.record(call.row())
        if self.inflight == 0:
            self._idle.set()

    def forward(self, conn: ClientConnection, path: bytes, body: bytes, keep_alive: bool) -> None:
        """A one-shot request (/tokenize, /detokenize) answered by a placeable engine."""
        engine = min((e for e in self.health.engines if e.placeable),
                     key=lambda e: e.outstanding, default=None)
        if engine is None:
            conn.respond(503, error_body(503, "no healthy engine can serve this request now",
                                         code="no_engine"), b"", keep_alive,
                         extra=b"retry-after: 1\r\n")
            return
        self._spawn(forward_once(conn, engine, path, body, keep_alive, self.limits,
                                 self.deadlines, self.metrics))

    # -- settling: the decision table's rows carried out --------------------------------------
    def _settle(self, call: Call, d: D.Decision, engine: Engine | None = None, *,
                reason: str = "", engine_status: int = 0, body: bytes = b"", detail: str = "",
                status: int = 0, extra: bytes = b"", reusable: bool = True) -> None:
        """End `call` as row `d` says: its status (the engine's own where the row passes it
        on), outcome and reason; one journal row; the client answered as the row's `reply`
        says; the KV a producer still holds taken where the row says so (from `engine`, the
        decode engine)."""
        call.decision = d
        call.status = status or d.status or engine_status
        if d.message:
            call.reason = d.message.format(
                engine=engine.id if engine is not None else "", reason=reason,
                status=engine_status, detail=detail,
                timeout=self._predicted_s(call, 1.0, self.limits.prefill_timeout_s))
        if d.release_kv and call.kv is not None:
            alive = engine is not None and d.health != D.HEALTH_FAILED \
                and d.health != D.HEALTH_SUSPECT
            self._release(call, call.kv, engine if alive else None)
        self._finish(call)
        reply = d.reply
        conn = call.conn
        if reply == D.ERROR:
            conn.respond(call.status, error_body(call.status, call.reason, code=d.code),
                         call.request_id, call.keep_alive, extra=extra)
        elif reply == D.BODY:
            conn.respond(call.status, body, call.request_id, call.keep_alive)
        elif reply == D.END_STREAM:
            conn.finish(call.keep_alive and reusable)
        elif reply == D.CLOSE:
            conn.finish(False)

    def _release(self, call: Call, kv: bytes, engine: Engine | None,
                 skip: Engine | None = None) -> None:
        """Have an engine read the KV the producer holds for `call` and no decode leg will:
        `engine` (a live decode engine that refused or whose client left), else another decode
        engine the canary does not hold from the producer. With none, the producer frees it
        when its lease runs out."""
        if engine is None:
            tried = [*call.decode_tries, *call.prefill_tries[-1:]]
            if skip is not None:
                tried.append(skip)
            engine = self.chooser.another_decode(call, tried)
            if engine is None or self._held_pair(call, engine):
                _log.warning("request %s: no engine left to read the KV its producer holds; "
                             "it is freed when its lease runs out",
                             call.request_id.decode("ascii", "replace"))
                return
        release_kv(call, engine, kv, self.limits, self.deadlines, self.metrics, self._spawn)

    def _learn(self, engine: Engine, d: D.Decision, reason: str) -> None:
        """What the row says the engine's health learns from how its leg ended."""
        health = d.health
        if health == D.HEALTH_OK:
            self.health.ok(engine)
        elif health == D.HEALTH_FAILED:
            self.health.failed(engine, reason)
            if self._warm:  # a restarted engine makes its connections anew
                self._warm = {p for p in self._warm if engine.id not in p}
        elif health == D.HEALTH_SUSPECT:
            self.health.suspect(engine)

    def _call_facts(self, call: Call, tries: list[Engine]) -> int:
        """The GONE fact (the client left) or the RETRY_OK one (tries left, the client still
        there, the router not stopping)."""
        if call.gone:
            return D.GONE
        return D.RETRY_OK if len(tries) < D.MAX_TRIES and not self.cutting else 0

    # -- placement --------------------------------------------------------------------------
    async def _tokenize_off_loop(self, call: Call) -> None:
        """A long prompt's token ids from a worker thread (the tokenizer's batch call releases
        the GIL), so the event loop serves every other request meanwhile; then placed as any
        other. A tokenizer that fails leaves the request placed blind to cache state."""
        cache = self.cache
        try:
            ids = await asyncio.to_thread(cache.ids_off_loop, call)
        except Exception:  # the library raises its own untyped errors
            _log.exception("request %s: tokenizing failed; placed blind", call.request_id)
            ids = None
        cache.apply(call, ids)
        if call.gone:
            self._settle(call, D.GONE_BEFORE_PREFILL)
        else:
            self._guard(call, self._place, True)

    def _place(self, call: Call, tokenized: bool = False) -> None:
        if (cache := self.cache) is not None and not tokenized:
            cache.before(call)
        placement = self.chooser.place(call)
        if placement is None:
            self._settle(call, D.NO_ENGINE, extra=b"retry-after: 1\r\n")
            return
        if isinstance(placement, Refusal):
            self._refuse(call, placement)
            return
        holds = self.holds
        if holds is not None and not placement.single \
                and holds.held(placement.prefill.id, placement.decode.id):
            # the canary caught this pair's handoff going wrong: its decode engine computes
            # the prompt itself (the engines keep serving; only the pair is held out)
            placement = replace(placement, prefill=placement.decode)
        call.placement = placement
        self.bookings.placed(call, placement)
        if cache is not None:
            cache.placed(call, placement)
        context = context_of(placement)
        if not self._fits(call, context):
            return
        if self.limits.tokenize or needs_count(call, context):
            self.bookings.counting(call)
            self._spawn(self._tokenize(call, placement.prefill))
        else:
            self._route(call)

    def _refuse(self, call: Call, refusal: Refusal) -> None:
        """Predictive admission said no: 429 with the priced Retry-After, one journal row."""
        self._settle(call, D.REFUSALS[refusal.kind], detail=refusal.detail,
                     extra=b"retry-after: %d\r\n" % refusal.retry_after_s)

    def _route(self, call: Call) -> None:
        placement = call.placement
        assert placement is not None
        if not self._fits(call, context_of(placement)):
            return
        if placement.single:
            call.mode = "single"
            call.prefill_engine = placement.prefill.id
            self._decode(call, placement.decode, None)
        else:
            call.t_prefill_start = time.monotonic()
            self._prefill(call, placement.prefill)

    def _fits(self, call: Call, context: int, decode: Engine | None = None) -> bool:
        """Refuse (400) a request whose prompt and max_tokens cannot fit the engines' context
        (context_fit.py); after the prefill leg, `decode` is asked to take the KV it left."""
        overflow = context_overflow(call, context)
        if overflow:
            self._settle(call, D.CONTEXT_TOO_LONG, decode, detail=overflow)
        return not overflow

    async def _explain(self, call: Call, engine: Engine, payload: bytes) -> None:
        """The prefill leg was refused: when the prompt and the client's max_tokens overflow
        the context, say so with the client's numbers (the leg itself asked for 1 token)."""
        await count_prompt(call, engine, self.limits, self.deadlines)
        assert call.placement is not None
        self._guard(call, self._explained, engine, payload)

    def _explained(self, call: Call, engine: Engine, payload: bytes) -> None:
        assert call.placement is not None
        if self._fits(call, context_of(call.placement)):
            self._settle(call, D.decide(D.PREFILL, D.REJECTED, 0), engine, engine_status=400,
                         body=engine_error_body(400, payload))

    async def _tokenize(self, call: Call, engine: Engine) -> None:
        """Exact prompt length from the engine's /tokenize (fleet: serving.prompt_length)."""
        await count_prompt(call, engine, self.limits, self.deadlines)
        if call.gone:
            self._settle(call, D.GONE_BEFORE_PREFILL)
        else:
            self._guard(call, self._route)

    # -- prefill leg ------------------------------------------------------------------------
    def _prefill(self, call: Call, engine: Engine, fresh: bool = False) -> None:
        if not fresh:
            call.prefill_tries.append(engine)
        call.prefill_engine = engine.id
        now = time.monotonic()
        self.bookings.prefill_queued(call, engine)
        leg = Collector(lambda s: self._guard(call, self._prefill_done, engine, s, fresh),
                        now + self._predicted_s(call, 1.0, self.limits.prefill_timeout_s))
        req = request_bytes(b"POST", call.path, engine.spec.host_header,
                            call.leg_id + b"-prefill", call.prefill_body(),
                            bearer=engine.spec.bearer)
        if engine.prefill_sent >= engine.prefill_line > 0 and not fresh:
            line = self._lines.get(engine)
            if line is None:
                line = self._lines[engine] = deque()
            line.append((call, leg, req))  # its deadline counts from now, not from its send
            return
        self._send_prefill(call, engine, leg, req, fresh)

    def _send_prefill(self, call: Call, engine: Engine, leg: Collector, req: bytes,
                      fresh: bool = False) -> None:
        self.bookings.prefill_sent(call, engine)
        dispatch(engine.pool, req, leg, self.deadlines, self._spawn, fresh=fresh)

    def _next_prefills(self, engine: Engine, flush: bool) -> None:
        """Send the prefill legs waiting in the engine's line while it holds fewer than its
        line allows; every one of them when `flush` (a leg there failed: each finds out for
        itself, and is retried elsewhere, rather than waiting out its deadline in the line).
        A request that ended meanwhile took its booking back (`_finish`); one whose client
        left is settled here, unsent."""
        line = self._lines.get(engine)
        while line and (flush or engine.prefill_sent < engine.prefill_line):
            call, leg, req = line.popleft()
            if call.finished:
                continue
            if call.gone:
                self._settle(call, D.GONE_BEFORE_PREFILL)
                continue
            self._send_prefill(call, engine, leg, req)

    def _prefill_done(self, call: Call, engine: Engine, leg: Collector, fresh: bool) -> None:
        self.deadlines.discard(leg)
        self.bookings.prefill_answered(call, engine)
        if engine.prefill_line:
            self._next_prefills(engine, leg.result != OK)
        status = leg.status
        facts = self._call_facts(call, call.prefill_tries)
        if leg.result == OK:
            end = D.answered(status)
            if status == 400 and call.max_tokens is not None and call.prompt_tokens is None \
                    and call.placement is not None and context_of(call.placement):
                facts |= D.OVERFLOW_POSSIBLE
        else:
            end = D.FAILED_BEFORE if leg.result == FAILED else D.TIMEOUT_BEFORE
            if leg.stale_keepalive and not fresh:
                facts |= D.STALE
        d = D.decide(D.PREFILL, end, facts)
        self._learn(engine, d, leg.reason)
        if d.again:
            self._prefill(call, engine, fresh=True)  # the engine had closed the idle connection
            return
        if d.retry:
            nxt = self.chooser.another_prefill(call, call.prefill_tries)
            if nxt is not None:
                self.metrics.retry("prefill")
                self._prefill(call, nxt)
                return
        payload = b"".join(leg.body)
        if leg.result == OK:
            call.t_prefill_done = time.monotonic()
            call.prefill_s = round(call.t_prefill_done - call.t_prefill_start, 6)
        if d.explain:
            self._spawn(self._explain(call, engine, payload))
            return
        if d.outcome is not None:
            self._settle(call, d, engine, reason=leg.reason or engine_text(payload),
                         engine_status=status, body=engine_error_body(status, payload))
            return
        kv = self._handoff(call, engine, payload)
        if kv is None:
            return
        call.kv = kv
        assert call.placement is not None
        decode = call.placement.decode
        if not self._fits(call, decode.context_len, decode):
            return
        wait = call.placement.decode_at - time.monotonic()
        if wait > 0.0:  # held by the scheduler until streams there end (projection.py)
            asyncio.get_running_loop().call_later(wait, self._guard, call, self._held,
                                                  decode, kv)
            return
        self._held(call, decode, kv)

    def _held(self, call: Call, decode: Engine, kv: bytes) -> None:
        """Send the decode leg, now or when a held leg's time came, unless the request ended
        or its client left meanwhile."""
        if call.finished:
            return
        if call.gone:
            self._settle(call, D.GONE_BEFORE_DECODE, decode)
            return
        self._decode(call, decode, kv)

    def _handoff(self, call: Call, engine: Engine, payload: bytes) -> bytes | None:
        """The producer's kv_transfer_params, re-encoded from its own JSON value unchanged."""
        try:
            doc = loads(payload)
            kv: Any = doc.get("kv_transfer_params")
            if kv is None:
                kv = (doc.get("choices") or [{}])[0].get("kv_transfer_params")
        except (ValueError, AttributeError, IndexError, TypeError):
            self._settle(call, D.PREFILL_BAD_BODY, engine)
            return None
        if not isinstance(kv, dict) or not kv:
            self._settle(call, D.NO_HANDOFF, engine)
            return None
        usage = doc.get("usage")
        if call.prompt_tokens is None and isinstance(usage, dict) \
                and type(usage.get("prompt_tokens")) is int:
            call.learned(usage["prompt_tokens"])
        if self.cache is not None:
            self.cache.observed(call, engine, usage)
        return dumps(kv)

    # -- decode leg -------------------------------------------------------------------------
    def _decode(self, call: Call, engine: Engine, kv: bytes | None, fresh: bool = False) -> None:
        if not fresh:
            call.decode_tries.append(engine)
            call.decode_attempts += 1
        call.decode_engine = engine.id
        call.kv = kv
        conn = call.conn

        def then(relay: R.DecodeRelay) -> None:
            self._guard(call, self._decode_done, engine, relay, fresh)

        relay: R.DecodeRelay
        stall = self._stall_s(call)
        first = self._first_byte_s(call, engine, kv, stall)
        if call.stream and call.http11:
            keep = call.keep_alive and not conn.closing
            relay = R.PassRelay(then, first, stall, conn,
                                stream_head(call.request_id, keep, True))
        elif call.stream:  # an HTTP/1.0 client: unframed body, ended by closing
            relay = R.StreamRelay(then, first, stall, conn,
                                  stream_head(call.request_id, False, False), False)
        else:
            relay = R.BufferRelay(then, first, stall)
        if call.stream and self._continuable(call):
            relay.log = C.sent_log(call.chat, call.http11)
        relay.stall = self._stall_check(call, engine)
        self.bookings.decode_started(call, engine, relay, kv is not None)
        call.relay = relay
        req = request_bytes(b"POST", call.path, engine.spec.host_header, call.leg_id,
                            call.decode_body(kv), bearer=engine.spec.bearer)
        dispatch(engine.pool, req, relay, self.deadlines, self._spawn,
                 raw=isinstance(relay, R.PassRelay), fresh=fresh)

    def _stall_s(self, call: Call) -> float:
        """The leg's stall deadline: steps of the step placement predicted for it (or the
        fleet's TPOT objective), within the floor and stream_idle_timeout_s."""
        limits = self.limits
        placement = call.placement
        step = placement.predicted_tpot_s if placement is not None else 0.0
        return stall_s(limits.stream_idle_timeout_s, limits.stall_steps, limits.stall_floor_s,
                       step if step > 0.0 else limits.slo_tpot_s)

    def _predicted_s(self, call: Call, scale: float, cap_s: float) -> float:
        """A leg that computes a prompt: the deadline for `scale` times the TTFT placement
        predicted for the request (a continuation's prompt is longer than the client's)."""
        limits, placement = self.limits, call.placement
        predicted = placement.predicted_ttft_s * scale if placement is not None else 0.0
        return leg_deadline_s(predicted, limits.deadline_factor, limits.deadline_floor_s, cap_s)

    def _first_byte_s(self, call: Call, engine: Engine, kv: bytes | None, stall: float) -> float:
        """A decode leg's first-byte deadline: the handoff's budget where it pulls KV over a
        warm pair (after the prefills booked on the consumer, which its first step waits
        for), the prefill's prediction where it computes the prompt itself."""
        cap = self.limits.first_token_timeout_s
        if kv is None:
            return self._predicted_s(call, 1.0, cap)
        if (call.prefill_engine or "", engine.id) not in self._warm:
            return cap
        queued = self.bookings.prefills_done_at(engine) - time.monotonic()
        return handoff_deadline_s(self.limits.handoff_budget_s,
                                  stall + (queued if queued > 0.0 else 0.0), cap)

    def _held_pair(self, call: Call, consumer: Engine) -> bool:
        """Whether the canary holds the handoff from this request's producer to `consumer`."""
        holds, placement = self.holds, call.placement
        return holds is not None and placement is not None and not placement.single \
            and holds.held(placement.prefill.id, consumer.id)

    def _stall_check(self, call: Call, engine: Engine) -> Callable[[R.DecodeRelay], float]:
        def more(relay: R.DecodeRelay) -> float:
            return self._stall_left(call, engine, relay)
        return more

    def _stall_left(self, call: Call, engine: Engine, relay: R.DecodeRelay) -> float:
        """Seconds more a silent stream is given before it counts as stalled (0: now). It
        waits out prefills booked on its engine (a step there waits for them), and where it
        could not be continued anyway it waits as long as any stream may be silent."""
        now = time.monotonic()
        since = relay.t_last or relay.t_first
        cap = since + self.limits.stream_idle_timeout_s
        if now >= cap:
            return 0.0
        if not self._continuable(call) or len(call.decode_tries) >= D.MAX_TRIES \
                or self.chooser.another_decode(call, call.decode_tries) is None:
            return cap - now
        until = min(cap, self.bookings.prefills_done_at(engine) + relay.idle_s)
        return until - now if until > now else 0.0

    def _continuable(self, call: Call) -> bool:
        """Whether a broken stream of this request may be continued (the reason it may not
        is kept for its journal row)."""
        if call.unresumable is None:
            call.unresumable = "serving.continue_midstream is false" \
                if not self.limits.continue_midstream else C.not_continuable(call.body, call.chat)
        return not call.unresumable

    def _decode_done(self, call: Call, engine: Engine, relay: R.DecodeRelay, fresh: bool) -> None:
        self.deadlines.discard(relay)
        self.bookings.decode_ended(call, engine)
        call.relay = None
        result = relay.result
        facts = self._call_facts(call, call.decode_tries)
        if call.stream:
            facts |= D.STREAMING
        if relay.started:
            facts |= D.STARTED
        if result == R.OK or result == R.ENGINE_STATUS:
            end = D.answered(relay.status)
        else:
            end = _DECODE_END[result]
            if result == R.FAILED_BEFORE and relay.reused and not fresh:
                facts |= D.STALE
            if (end == D.FAILED_MID or end == D.TIMEOUT_MID) and relay.clean() \
                    and self._continuable(call):
                facts |= D.CONTINUABLE
        d = D.decide(D.DECODE, end, facts)
        self._learn(engine, d, relay.reason)
        if d.resume:
            self._resume(call, engine, relay, D.decide(D.DECODE, end, facts & ~D.CONTINUABLE))
            return
        if d.again:
            self._decode(call, engine, call.kv, fresh=True)  # engine had closed the idle conn
            return
        if d.retry:
            nxt = self.chooser.another_decode(call, call.decode_tries)
            if nxt is not None:
                self.metrics.retry("decode")
                if relay.error_first:
                    call.kv = None  # not pulled, and the consumer's clean-up freed it: nxt computes
                elif call.kv is not None and self._held_pair(call, nxt):
                    self._release(call, call.kv, None, skip=nxt)  # not by nxt: nxt computes it
                    call.kv = None
                self._decode(call, nxt, call.kv)
                return
        self._timings(call, engine, relay, result == R.OK)
        if d.outcome is None:  # a buffered reply: reassembled from the stream
            self._reply_reassembled(call, relay)
            return
        if end == D.REJECTED or end == D.ENGINE_5XX:  # the engine's own answer is the reply
            payload = b"".join(relay.body)
            self._settle(call, d, engine, reason=engine_text(payload), engine_status=relay.status,
                         body=engine_error_body(relay.status, payload))
        else:
            self._settle(call, d, engine, reason=self._why(call, relay, end),
                         reusable=relay.owe_break())

    @staticmethod
    def _why(call: Call, relay: R.DecodeRelay, end: str) -> str:
        """The leg's reason, and why a stream it broke was not continued."""
        if (end == D.FAILED_MID or end == D.TIMEOUT_MID) and call.unresumable:
            return f"{relay.reason}; not continued: {call.unresumable}"
        return relay.reason

    def _timings(self, call: Call, engine: Engine, relay: R.DecodeRelay, ok: bool) -> None:
        """TTFT, the handoff and TPOT, from the legs that carried the answer (a continued
        stream's first leg gave its first token)."""
        first = call.t_first_token or (relay.t_first if relay.started else 0.0)
        if first:
            call.ttft_s = round(first - call.t0, 6)
            if call.t_prefill_done and not call.t_first_token:
                call.handoff_s = round(first - call.t_prefill_done, 6)
                self.bookings.handoff(engine, call.handoff_s)
                if call.kv is not None and call.prefill_engine is not None:
                    self._warm.add((call.prefill_engine, engine.id))
        if call.stream:
            call.events = max(0, call.events_before + relay.events - (1 if ok else 0))
            last = relay.t_last or first
            if call.events > 1 and last > first:
                call.tpot_s = round((last - first) / (call.events - 1), 6)

    # -- continuing a broken stream (continuation.py) -------------------------------------------
    def _resume(self, call: Call, engine: Engine, relay: R.DecodeRelay,
                otherwise: D.Decision) -> None:
        """The decode leg broke after the client got part of the answer: continue it on
        another engine, or settle as `otherwise` says when none is left or nothing can be
        read back."""
        sink = relay.sink if isinstance(relay, R.ContinueRelay) else relay
        sent = self._sent(call, relay, sink)
        nxt = self.chooser.another_decode(call, call.decode_tries) if sent is not None else None
        if nxt is None or sent is None:
            self._timings(call, engine, relay, False)
            self._settle(call, otherwise, engine, reason=relay.reason,
                         reusable=relay.owe_break())
            return
        owed, relay.broken = relay.broken, None  # the rest comes instead of the error event
        if not call.t_first_token:
            call.t_first_token = relay.t_first
            call.ttft_s = round(relay.t_first - call.t0, 6)
        call.events_before += relay.events
        self.metrics.retry("continuation")
        self._spawn(self._continue(call, engine, nxt, sink, sent, relay.reason,
                                   (otherwise, owed)))

    @staticmethod
    def _sent(call: Call, relay: R.DecodeRelay, sink: R.DecodeRelay) -> C.Sent | None:
        """What the client holds of the answer: a continuation's own account, the relay's
        log of forwarded bytes, or a buffered reply's events (cut to its last whole one)."""
        if isinstance(relay, R.ContinueRelay):
            return relay.rewriter.sent if isinstance(relay.rewriter, C.Rewriter) else None
        if relay.log is not None:
            return C.read_back(relay.log)
        raw = b"".join(sink.body)
        cut = raw.rfind(b"\n\n")
        sink.body[:] = [raw[:cut + 2]] if cut >= 0 else []
        sent = C.Sent()
        sent.read(raw[:cut + 2], call.chat)
        return None if sent.unreadable else sent

    async def _continue(self, call: Call, failed: Engine, engine: Engine, sink: R.DecodeRelay,
                        sent: C.Sent, reason: str, otherwise: Settled) -> None:
        """Count the answer so far on `engine`, then send it the continued request (or end
        the stream there when the answer was already whole); `otherwise` is how the break
        settles if it cannot be continued after all: its row and the error event owed."""
        counted = await count_continued(call, engine, sent.text, self.limits, self.deadlines)
        self._guard(call, self._counted, failed, engine, sink, sent, reason, otherwise, counted)

    def _counted(self, call: Call, failed: Engine, engine: Engine, sink: R.DecodeRelay,
                 sent: C.Sent, reason: str, otherwise: Settled,
                 counted: tuple[C.Counts, list[int] | None] | None) -> None:
        if call.finished:
            return
        if call.gone:
            self._settle(call, D.decide(D.DECODE, D.CLIENT_GONE, 0), engine,
                         reason="client closed the connection")
            return
        if counted is None or self.cutting:
            decision, sink.broken = otherwise
            self._settle(call, decision, failed, reason=reason, reusable=sink.owe_break())
            return
        counts, text_ids = counted
        call.record_continuation(failed.id, engine.id, counts.generated, reason,
                                 C.exact(call.body))
        left = C.remaining(call.body, call.chat, counts.generated)
        if sent.finish is not None or sent.done or (left is not None and left <= 0):
            self._close_whole(call, sink, sent, counts)
            return
        self._decode_continued(call, engine, sink, sent, counts, text_ids)

    def _close_whole(self, call: Call, sink: R.DecodeRelay, sent: C.Sent,
                     counts: C.Counts) -> None:
        """The answer was whole when its engine failed: send the client the end it lacks."""
        usage = not call.stream or bool((call.body.get("stream_options") or {})
                                        .get("include_usage"))
        sink.write_events(C.closing_events(sent, counts, call.chat, usage, "length"), True)
        d = D.decide(D.DECODE, D.ANSWERED, D.STREAMING if call.stream else 0)
        if d.outcome is None:
            self._reply_reassembled(call, sink)
        else:
            self._settle(call, d, reusable=sink.reusable())

    def _decode_continued(self, call: Call, engine: Engine, sink: R.DecodeRelay, sent: C.Sent,
                          counts: C.Counts, text_ids: list[int] | None) -> None:
        """Send the continued request to `engine`; its events go to the client through
        `sink`, rewritten as the first engine's."""
        call.decode_tries.append(engine)
        call.decode_attempts += 1
        call.decode_engine = engine.id
        call.carried = counts.generated
        call.kv = None

        def then(relay: R.DecodeRelay) -> None:
            self._guard(call, self._decode_done, engine, relay, True)

        longer = (counts.prompt + counts.generated) / max(counts.prompt, 1)
        relay = R.ContinueRelay(then, self._predicted_s(call, longer,
                                                        self.limits.first_token_timeout_s),
                                self._stall_s(call), sink, C.Rewriter(sent, counts, call.chat))
        relay.stall = self._stall_check(call, engine)
        self.bookings.decode_started(call, engine, relay, False)
        call.relay = relay
        options = call.body.get("stream_options") if call.stream else {"include_usage": True}
        body = C.request_body(call.body, call.chat, sent.text, text_ids, counts, options)
        req = request_bytes(b"POST", call.path, engine.spec.host_header, call.leg_id + b"-cont",
                            body, bearer=engine.spec.bearer)
        dispatch(engine.pool, req, relay, self.deadlines, self._spawn)

    def _reply_reassembled(self, call: Call, relay: R.DecodeRelay) -> None:
        try:
            body = reassemble(b"".join(relay.body), call.chat)
        except StreamError as exc:
            self._settle(call, D.STREAM_UNREADABLE, status=exc.status, detail=str(exc))
            return
        usage = body.get("usage")
        if call.prompt_tokens is None and isinstance(usage, dict):
            pt = usage.get("prompt_tokens")
            if type(pt) is int:
                call.learned(pt)
        if self.cache is not None and call.placement is not None and call.placement.single:
            self.cache.observed(call, call.placement.decode, usage)  # a plain request's prompt
        self._settle(call, D.REPLIED, body=dumps(body))
