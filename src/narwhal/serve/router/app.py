"""Wire the router together and run its lifecycle: start, serve, drain on SIGTERM, flush.

Startup opens the journal (a bad path fails here, not on the first request), probes every
engine once (engines start held out until their /health answers 200), then listens. On
SIGTERM or SIGINT it stops accepting, lets in-flight requests finish for at most
`serving.drain_timeout_s`, cuts what is left (each cut request still gets its journal row),
and flushes the journal before returning a summary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import signal
import time
from typing import Any

from narwhal.core.errors import InputError, Problem
from narwhal.serve.router.cache.view import CacheFamilies, CacheView
from narwhal.serve.router.canary.holds import PairHolds
from narwhal.serve.router.canary.probe import Canary
from narwhal.serve.router.control.attestation import HELD, Attestation, Attestor
from narwhal.serve.router.control.leadership import Leadership
from narwhal.serve.router.control.lease import Claimant, FileLease, Lease
from narwhal.serve.router.control.quorum_lease import QuorumLease
from narwhal.serve.router.front import descriptors
from narwhal.serve.router.front.connections import Connections
from narwhal.serve.router.front.front import ClientConnection
from narwhal.serve.router.front.routes import Routes
from narwhal.serve.router.observe.journal import Journal
from narwhal.serve.router.observe.metrics import RouterMetrics
from narwhal.serve.router.request.deadlines import Deadlines
from narwhal.serve.router.request.health import Health
from narwhal.serve.router.request.legs import LegFailed, LegTimedOut, exchange, request_bytes
from narwhal.serve.router.request.proxy import Proxy
from narwhal.serve.router.request.upstream import Connector, EnginePool, EngineUnreachable
from narwhal.serve.router.scheduling.choosers import EngineChooser, LeastOutstanding
from narwhal.serve.router.scheduling.engines import Engine
from narwhal.serve.router.scheduling.generation import Binder, ProfileBook
from narwhal.serve.router.scheduling.planner import Refused
from narwhal.serve.router.scheduling.roles import RoleController
from narwhal.serve.router.scheduling.scheduler import CurvePriced
from narwhal.serve.router.settings import ControllerPolicy, RouterSettings

_log = logging.getLogger("narwhal.serve")


def _lease(control: ControllerPolicy) -> Lease:
    """The fleet's lease backend: a majority of its sidecars when it names them, else the file."""
    q = control.quorum
    if q is None:
        return FileLease(control.lease_path, control.lease_ttl_s)
    return QuorumLease(q.lease_urls, q.key, q.deployment, control.lease_ttl_s)


def _within_descriptors(settings: RouterSettings) -> tuple[descriptors.Budget, RouterSettings]:
    """The descriptor budget and the settings with client limits lowered to fit it.

    Decided before anything opens a socket or a file: a router whose clients could take every
    descriptor could no longer renew its lease or reach an engine (descriptors.py). Too few
    descriptors for even the reserve is an InputError, so startup stops (exit 2) saying which
    limit to raise; limits lowered to fit are logged once."""
    nofile = descriptors.raise_soft_limit()
    try:
        budget = descriptors.plan(nofile, settings.clients.max_connections,
                                  settings.limits.max_concurrent, len(settings.engines))
    except descriptors.TooFewDescriptors as exc:
        raise InputError("process limits", [Problem(
            "RLIMIT_NOFILE", str(exc), "raise the open-files limit of the router's "
            "process")]) from None
    note = budget.note(settings.clients.max_connections, settings.limits.max_concurrent)
    if note:
        _log.warning("%s", note)
    settings = dataclasses.replace(
        settings,
        limits=dataclasses.replace(settings.limits, max_concurrent=budget.max_concurrent),
        clients=dataclasses.replace(settings.clients, max_connections=budget.max_connections))
    return budget, settings


def _sweep_period_s(settings: RouterSettings) -> float:
    """How often the timeout sweep runs: a quarter of the shortest timeout it enforces (within
    50 ms and 1 s), so no deadline is overshot by more than a fraction of itself, without a
    timer per leg."""
    limits = settings.limits
    shortest = min(limits.connect_timeout_s, limits.prefill_timeout_s,
                   limits.first_token_timeout_s, limits.stream_idle_timeout_s,
                   settings.health.probe_timeout_s)
    return min(1.0, max(0.05, shortest / 4))


def _keep_startup_objects_out_of_gc() -> None:
    """Everything built before serving lives as long as the process: keep it out of the cycle
    collector's scans. Request objects die by reference counting, so the collector has little
    to find among them; running it every 20k allocations instead of CPython's default 700
    makes its scans rare on the request path without letting garbage pile up (docs/router.md,
    "How the hot path is built", has the share of request CPU this saved)."""
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def _end_background(tasks: tuple[asyncio.Task[Any], ...]) -> None:
    """Cancel the router's own tasks, then ignore stop and reload signals for good.

    The shutdown is under way and bounded: a stop signal from now until the process exits (the
    loop's threads joining, the result line printed) is one more request to stop, and a reload
    one for a router that is going; the default action would answer either by killing it with
    no result.

    The disposition goes straight from the loop's handler to ignore: removing the handler
    first would restore the default action for a moment, and a signal in that moment killed
    the router. uvloop's close leaves a stopped loop's dispositions as they are."""
    for task in tasks:
        task.cancel()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


class Router:
    """One router process's objects, built once from settled configuration."""

    def __init__(self, settings: RouterSettings, *, connector: Connector | None = None,
                 chooser: EngineChooser | None = None, lease: Lease | None = None,
                 standby_of: str | None = None) -> None:
        self.budget, settings = _within_descriptors(settings)
        self.settings = settings
        self.deadlines = Deadlines(period_s=_sweep_period_s(settings))
        self.engines = self._engines(connector)
        self.binder = self._profile_binder()
        self.attestor = self._attestor()
        self.health = Health(self.engines, settings.health, self.deadlines)
        self.metrics = RouterMetrics(settings.ttft_s, settings.tpot_s)
        self.journal = Journal(settings.journal_path, settings.journal_max_rows)
        if chooser is None:
            chooser = self._default_chooser()
        self.roles = self._role_controller(chooser)
        self.proxy = Proxy(settings.limits, chooser, self.health, self.metrics, self.journal,
                           self.deadlines)
        self.cache = self._cache()
        self.leadership = self._leadership(lease, standby_of)
        self.canary = self._canary()
        self.routes = Routes(settings, self.proxy, self.engines, self.metrics, self.journal,
                             self.leadership, self.binder.book if self.binder else None,
                             self.roles)
        self.metrics.attach_state(self.engines, self.journal, lambda: self.proxy.inflight,
                                  self.leadership,
                                  chooser if isinstance(chooser, CurvePriced) else None,
                                  self.roles)
        budget = self.budget
        self.connections = Connections(settings.clients, descriptors.LimitWatch(
            budget.nofile, budget.max_connections, budget.max_concurrent, len(settings.engines)))
        self.routes.connections = self.connections
        self.routes.canary = self.canary
        self.metrics.connections = self.connections
        self._stop = asyncio.Event()

    def _engines(self, connector: Connector | None) -> list[Engine]:
        """One Engine per fleet entry, each with its own keep-alive pool sized by the
        descriptor budget. Every engine starts ejected: none takes a leg before its first
        /health answers 200 (the startup probe or a sweep readmits it)."""
        limits = self.settings.limits
        engines = [
            Engine(spec, EnginePool(spec.host, spec.port,
                                    connect_timeout_s=limits.connect_timeout_s,
                                    keepalive_s=limits.upstream_keepalive_s, connector=connector,
                                    max_idle=self.budget.idle_per_engine))
            for spec in self.settings.engines
        ]
        for engine in engines:
            engine.ejected, engine.ejected_reason = True, "not probed yet"
        return engines

    def _profile_binder(self) -> Binder | None:
        """With a profile store, the binder that prices each engine only by its live
        generation's row; None without one. The store is read here, so a missing or invalid
        one is an InputError that stops startup (exit 2) before anything listens. Every engine
        is held until its generation is read: a row must not price a process it was not
        measured on."""
        settings = self.settings
        if settings.profiles_path is None:
            return None
        book = ProfileBook(settings.profiles_path, settings.model,
                           tuple(e.id for e in self.engines))
        book.load()
        for engine in self.engines:
            engine.held, engine.held_detail = "generation_unknown", "generation not read yet"
        return Binder(self.engines, book, self.deadlines,
                      settings.health.probe_timeout_s, settings.health.probe_interval_s,
                      {k: c.attestation_digest for k, (_, c) in settings.attestations.items()})

    def _attestor(self) -> Attestor | None:
        """For Gate E's fleet, the attestor that places an engine only while its sidecar
        vouches for it; None otherwise. Attested engines are held until their sidecar is first
        read. A hold drops the engine's profile row, and the profile binding never lifts the
        hold, so the attestor asks the binder to bind the engine again when its sidecar
        vouches once more."""
        settings = self.settings
        if not settings.attestations:
            return None
        for engine in self.engines:
            if engine.id in settings.attestations:
                engine.held, engine.held_detail = HELD, "attestation not read yet"
        return Attestor(
            self.engines, {k: Attestation(url, contract)
                           for k, (url, contract) in settings.attestations.items()},
            settings.health.probe_timeout_s, settings.health.probe_interval_s,
            rebind=self.binder.bind if self.binder is not None else None)

    def _default_chooser(self) -> EngineChooser:
        """With a profile store, place on measured curves and admit by TTFT; without one there
        is nothing to price by, so the least-outstanding policy.

        Overflow to the other pool only under the planner: it sizes the pools from the demand
        offered, which overflow does not change, while the reactive controller's loads would
        count the overflow requests as the other pool's and flap."""
        if self.binder is None:
            return LeastOutstanding(self.engines)
        flips = self.settings.role_flips
        return CurvePriced(self.engines, self.settings.ttft_s, self.settings.tpot_s,
                           weights=self.settings.tenants.weights,
                           overflow=flips is not None and flips.mode == "planner")

    def _canary(self) -> Canary | None:
        """The live KV canary, when the fleet names its reference: the proxy asks its holds
        before a KV handoff, the state and metrics show every pair."""
        settings = self.settings.canary
        if settings is None:
            return None
        holds = PairHolds(settings.release_after, self.metrics.registry)
        self.proxy.holds = holds
        return Canary(settings, self.settings.model, self.engines, holds, self.deadlines,
                      self.settings.limits.first_token_timeout_s,
                      lambda: self.leadership.role == "primary",
                      lambda: (self.proxy.served, self.proxy.inflight))

    def _cache(self) -> CacheView | None:
        """Cache-aware placement when the fleet asks for it: the model's tokenizer is read here
        (a missing one stops startup, exit 2), the proxy asks the view before placing, and
        /metrics carries its families."""
        settings = self.settings.cache
        if settings is None:
            return None
        view = CacheView(settings, [e.id for e in self.engines])
        self.proxy.cache = view
        self.metrics.registry.register(CacheFamilies(view))
        return view

    async def _size_caches(self) -> None:
        """Block size and capacity of every engine followed by routing history, from its own
        vllm:cache_config_info; an engine that does not say stays unsized (never learns)."""
        view = self.cache
        if view is None:
            return
        timeout = self.settings.health.probe_timeout_s
        for engine in self.engines:
            if engine.ejected or view.fleet.engines[engine.id].mode != "approximate":
                continue
            try:
                status, text = await exchange(engine.pool, request_bytes(
                    b"GET", b"/metrics", engine.spec.host_header, b"", None,
                    bearer=engine.spec.bearer), timeout, self.deadlines)
            except (EngineUnreachable, LegFailed, LegTimedOut):
                continue
            if status == 200:
                view.size(engine.id, text)

    def _role_controller(self, chooser: EngineChooser) -> RoleController | None:
        """The controller that moves `both` engines between pools, when the fleet asks for
        one. Role flips need curves to price both pools' load; core/fleet.py refuses the
        section without a profiles store, so `binder` is set whenever role_flips is. The
        planner reads the demand offered (refused requests included) from a curve-priced
        chooser; with another chooser it has none to read."""
        settings = self.settings
        if settings.role_flips is None or self.binder is None:
            return None
        priced = chooser if isinstance(chooser, CurvePriced) else None
        return RoleController(
            self.engines, settings.ttft_s, settings.tpot_s, settings.role_flips,
            offered_prefill_s=None if priced is None else (lambda: priced.offered_prefill_s),
            refused_decode=None if priced is None else (
                lambda: Refused(priced.refused_decode_stream_s, priced.refused_decode_token_s,
                                priced.refused_decode_arrival_s)),
            offered_requests=None if priced is None else (lambda: priced.offered_requests))

    def _leadership(self, lease: Lease | None, standby_of: str | None) -> Leadership:
        """The controller lease this router must hold to place requests (the fleet's backend
        unless the caller hands one in). Losing it to another router fences this one: it stops,
        drains and exits, so two routers never place on one fleet."""
        control = self.settings.controller
        ops = self.settings.ops
        leadership = Leadership(
            lease or _lease(control),
            Claimant.this_process(""), control, self.engines, standby_of=standby_of,
            ops_key=ops.secret.reveal().encode() if ops.secret else b"")
        leadership.on_fenced = self.stop
        return leadership

    def stop(self) -> None:
        self._stop.set()

    async def serve(self, host: str, port: int) -> dict[str, Any]:
        """Claim the lease (or stand by), serve until stopped, drain; raises LeaseHeld when
        another router holds this fleet's lease and this one is not a standby."""
        loop = asyncio.get_running_loop()
        lead = self.leadership
        lead.claimant = Claimant.this_process(f"http://{host}:{port}")
        if lead.standby_of is None:
            await asyncio.to_thread(lead.claim)
        await self._before_listening()
        clients = self.settings.clients
        server = await loop.create_server(
            lambda: ClientConnection(self.routes, clients, self.connections),
            host, port, backlog=2048, reuse_address=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        background = self._start_background(loop)
        leasing = [loop.create_task(lead.keep())]
        if lead.standby_of is not None:
            leasing.append(loop.create_task(lead.follow(self.deadlines)))
        _keep_startup_objects_out_of_gc()
        admitted = sum(e.placeable for e in self.engines)
        _log.warning("%s for %s on http://%s:%d with %d engines (%d placeable), "
                     "lease epoch %d", "standing by" if lead.standby_of else "serving",
                     self.settings.model, host, port, len(self.engines), admitted, lead.epoch)
        try:
            await self._stop.wait()
            for task in leasing:
                task.cancel()
            await lead.release()  # a standby may take over while this one drains
            summary = await self._shutdown(server)
            summary["lease"] = {"epoch": lead.last_epoch, "role": lead.role,
                                "fenced_reason": lead.fenced_reason or None,
                                "took_over_at": lead.took_over_at}
            return summary
        finally:
            _end_background((*background, *leasing))

    async def _before_listening(self) -> None:
        """Open the journal and read every engine once before the port opens: a bad journal
        path fails startup rather than the first request, and the first requests find the
        engines that answer admitted, attested and bound to their profile rows instead of all
        of them held out until the first sweep."""
        self.journal.open()
        await self.health.probe_all()
        if self.attestor is not None:
            await self.attestor.sweep()
        if self.binder is not None:
            await self.binder.sweep()
        await self._size_caches()

    def _start_background(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[Any]]:
        """The periodic work off the request path (timeout sweep, health, loop-lag watch,
        connection sweep, and the attestation, profile and role loops this fleet has). SIGHUP
        re-reads the profile store at once, for an operator who just re-profiled an engine."""
        background = [loop.create_task(c) for c in (
            self.deadlines.run(), self.health.run(), self.metrics.watch_loop_lag(),
            self.connections.run())]
        if self.attestor is not None:
            background.append(loop.create_task(self.attestor.run()))
        if self.binder is not None:
            background.append(loop.create_task(self.binder.run()))
            loop.add_signal_handler(signal.SIGHUP, self.binder.reload_now)
        if self.roles is not None:
            background.append(loop.create_task(self.roles.run()))
        if self.cache is not None:
            background += [loop.create_task(feed) for feed in self.cache.feeds()]
        if self.canary is not None:
            background.append(loop.create_task(self.canary.run()))
        return background

    async def _shutdown(self, server: asyncio.Server) -> dict[str, Any]:
        t0 = time.monotonic()
        self.routes.draining = True
        server.close()
        for conn in self.connections:
            conn.begin_close()
        left = self.proxy.inflight
        drained = await self.proxy.wait_idle(self.settings.limits.drain_timeout_s)
        cut = 0
        if not drained:
            cut = self.proxy.inflight
            _log.warning("drain timeout: cutting %d requests still in flight", cut)
            self.proxy.cut_all()
            for engine in self.engines:
                engine.pool.close_all()  # legs still waiting on an engine fail now
            if not await self.proxy.wait_idle(5.0):
                for conn in self.connections:
                    if conn.transport is not None:
                        conn.transport.abort()
                await self.proxy.wait_idle(5.0)
        for engine in self.engines:
            engine.pool.close_all()
        self.journal.close()
        return {
            "served": self.proxy.served,
            "inflight_at_stop": left,
            "cut_at_drain_timeout": cut,
            "drain_s": round(time.monotonic() - t0, 3),
            "journal": str(self.journal.path),
            "journal_rows": self.journal.written,
            "journal_dropped": self.journal.dropped,
        }
