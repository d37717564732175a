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
from narwhal.serve import descriptors
from narwhal.serve.attestation import HELD, Attestation, Attestor
from narwhal.serve.choosers import EngineChooser, LeastOutstanding
from narwhal.serve.connections import Connections
from narwhal.serve.deadlines import Deadlines
from narwhal.serve.engines import Engine
from narwhal.serve.front import ClientConnection
from narwhal.serve.generation import Binder, ProfileBook
from narwhal.serve.health import Health
from narwhal.serve.journal import Journal
from narwhal.serve.leadership import Leadership
from narwhal.serve.lease import Claimant, FileLease, Lease
from narwhal.serve.metrics import RouterMetrics
from narwhal.serve.planner import Refused
from narwhal.serve.proxy import Proxy
from narwhal.serve.quorum_lease import QuorumLease
from narwhal.serve.roles import RoleController
from narwhal.serve.routes import Routes
from narwhal.serve.scheduler import CurvePriced
from narwhal.serve.settings import ControllerPolicy, RouterSettings
from narwhal.serve.upstream import Connector, EnginePool

_log = logging.getLogger("narwhal.serve")


def _lease(control: ControllerPolicy) -> Lease:
    """The fleet's lease backend: a majority of its sidecars when it names them, else the file."""
    q = control.quorum
    if q is None:
        return FileLease(control.lease_path, control.lease_ttl_s)
    return QuorumLease(q.lease_urls, q.key, q.deployment, control.lease_ttl_s)


class Router:
    """One router process's objects, built once from settled configuration."""

    def __init__(self, settings: RouterSettings, *, connector: Connector | None = None,
                 chooser: EngineChooser | None = None, lease: Lease | None = None,
                 standby_of: str | None = None) -> None:
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
        self.budget = budget
        self.settings = settings
        limits = settings.limits
        shortest = min(limits.connect_timeout_s, limits.prefill_timeout_s,
                       limits.first_token_timeout_s, limits.stream_idle_timeout_s,
                       settings.health.probe_timeout_s)
        self.deadlines = Deadlines(period_s=min(1.0, max(0.05, shortest / 4)))
        self.engines = [
            Engine(spec, EnginePool(spec.host, spec.port, connect_timeout_s=limits.connect_timeout_s,
                                    keepalive_s=limits.upstream_keepalive_s, connector=connector,
                                    max_idle=budget.idle_per_engine))
            for spec in settings.engines
        ]
        for engine in self.engines:
            engine.ejected, engine.ejected_reason = True, "not probed yet"
        self.binder: Binder | None = None
        if settings.profiles_path is not None:  # InputError here stops startup (exit 2)
            book = ProfileBook(settings.profiles_path, settings.model,
                               tuple(e.id for e in self.engines))
            book.load()
            for engine in self.engines:
                engine.held, engine.held_detail = "generation_unknown", "generation not read yet"
            self.binder = Binder(self.engines, book, self.deadlines,
                                 settings.health.probe_timeout_s, settings.health.probe_interval_s,
                                 {k: c.attestation_digest
                                  for k, (_, c) in settings.attestations.items()})
        self.attestor: Attestor | None = None
        if settings.attestations:  # Gate E's fleet: placed only while its sidecar vouches
            for engine in self.engines:
                if engine.id in settings.attestations:
                    engine.held, engine.held_detail = HELD, "attestation not read yet"
            self.attestor = Attestor(
                self.engines, {k: Attestation(url, contract)
                               for k, (url, contract) in settings.attestations.items()},
                settings.health.probe_timeout_s, settings.health.probe_interval_s,
                rebind=self.binder.bind if self.binder is not None else None)
        self.health = Health(self.engines, settings.health, self.deadlines)
        self.metrics = RouterMetrics(settings.ttft_s, settings.tpot_s)
        self.journal = Journal(settings.journal_path, settings.journal_max_rows)
        if chooser is None:  # with a profile store, place on measured curves and admit by TTFT
            # Overflow to the other pool only under the planner: it sizes the pools from the
            # demand offered, which overflow does not change, while the reactive controller's
            # loads would count the overflow requests as the other pool's and flap.
            flips = settings.role_flips
            chooser = (CurvePriced(self.engines, settings.ttft_s, settings.tpot_s,
                                   weights=settings.tenants.weights,
                                   overflow=flips is not None and flips.mode == "planner")
                       if self.binder is not None else LeastOutstanding(self.engines))
        # Role flips need curves to price both pools' load; core/fleet.py refuses the section
        # without a profiles store, so `binder` is set whenever role_flips is.
        self.roles: RoleController | None = None
        if settings.role_flips is not None and self.binder is not None:
            priced = chooser if isinstance(chooser, CurvePriced) else None
            self.roles = RoleController(
                self.engines, settings.ttft_s, settings.tpot_s, settings.role_flips,
                offered_prefill_s=None if priced is None else (lambda: priced.offered_prefill_s),
                refused_decode=None if priced is None else (
                    lambda: Refused(priced.refused_decode_stream_s, priced.refused_decode_token_s,
                                    priced.refused_decode_arrival_s)),
                offered_requests=None if priced is None else (lambda: priced.offered_requests))
        self.proxy = Proxy(limits, chooser, self.health, self.metrics, self.journal,
                           self.deadlines)
        control = settings.controller
        self.leadership = Leadership(
            lease or _lease(control),
            Claimant.this_process(""), control, self.engines, standby_of=standby_of,
            ops_key=settings.ops.secret.reveal().encode() if settings.ops.secret else b"")
        self.leadership.on_fenced = self.stop
        self.routes = Routes(settings, self.proxy, self.engines, self.metrics, self.journal,
                             self.leadership, self.binder.book if self.binder else None,
                             self.roles)
        self.metrics.attach_state(self.engines, self.journal, lambda: self.proxy.inflight,
                                  self.leadership,
                                  chooser if isinstance(chooser, CurvePriced) else None,
                                  self.roles)
        self.connections = Connections(settings.clients)
        self.routes.connections = self.connections
        self.metrics.connections = self.connections
        self._stop = asyncio.Event()

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
        self.journal.open()
        await self.health.probe_all()
        if self.attestor is not None:
            await self.attestor.sweep()
        if self.binder is not None:
            await self.binder.sweep()
        clients = self.settings.clients
        server = await loop.create_server(
            lambda: ClientConnection(self.routes, clients, self.connections),
            host, port, backlog=2048, reuse_address=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
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
        leasing = [loop.create_task(lead.keep())]
        if lead.standby_of is not None:
            leasing.append(loop.create_task(lead.follow(self.deadlines)))
        # Everything built so far lives as long as the process: keep it out of the collector's
        # scans. Request objects die by reference counting, so the cycle collector has little
        # to find; running it every 20k allocations instead of 700 cuts its share of request
        # CPU from ~5% to noise without letting garbage pile up.
        gc.freeze()
        gc.set_threshold(20_000, 50, 100)
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
            for task in (*background, *leasing):
                task.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            # The shutdown is under way and bounded: a stop signal from now until the process
            # exits (the loop's threads joining, the result line printed) is one more request
            # to stop, and a reload one for a router that is going; the default action would
            # answer either by killing it with no result.
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)

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
