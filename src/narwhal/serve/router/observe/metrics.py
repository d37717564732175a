"""Prometheus metrics for the router, with histogram buckets derived from the fleet's SLO.

The request path only bumps plain integers: a histogram observation is one `bisect` and two
additions, a counter is a dict entry. Everything is turned into Prometheus families at scrape
time by one collector, which also reads engine state, in-flight counts and journal counters
from the live objects. prometheus_client's own metric classes take a lock and walk their
buckets in Python on every observation, several times the cost, for thread safety the
single-threaded event loop does not need. The exposition format is still prometheus_client's.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from narwhal.serve.router.control.leadership import Leadership
from narwhal.serve.router.observe.journal import Journal
from narwhal.serve.router.scheduling.engines import Engine, pools
from narwhal.serve.router.scheduling.roles import RoleController
from narwhal.serve.router.scheduling.scheduler import CurvePriced

_FRACTIONS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def slo_buckets(slo_s: float) -> tuple[float, ...]:
    """Buckets at fixed fractions of an SLO, so 'within SLO' is always a bucket edge."""
    return tuple(round(slo_s * f, 9) for f in _FRACTIONS)


class Hist:
    """A histogram owned by the event loop: per-bucket counts and a sum."""

    __slots__ = ("bounds", "counts", "help", "name", "sum")

    def __init__(self, name: str, help_text: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.help = help_text
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def family(self) -> HistogramMetricFamily:
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            buckets.append((repr(float(bound)), float(running)))
        buckets.append(("+Inf", float(running + self.counts[-1])))
        return HistogramMetricFamily(self.name, self.help, buckets=buckets, sum_value=self.sum)


class RouterMetrics:
    """Every metric the router exports, in its own registry."""

    def __init__(self, ttft_s: float, tpot_s: float) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.ttft = Hist("narwhal_router_ttft_seconds",
                         "Request arrival to first streamed byte sent to the client",
                         slo_buckets(ttft_s))
        self.tpot = Hist("narwhal_router_tpot_seconds",
                         "Mean gap between streamed events of one request", slo_buckets(tpot_s))
        self.handoff = Hist("narwhal_router_handoff_seconds",
                            "Prefill response complete to first decode byte (KV pull included)",
                            slo_buckets(ttft_s))
        self.loop_lag = Hist("narwhal_router_event_loop_lag_seconds",
                             "How late a periodic event-loop tick ran", _LAG_BUCKETS)
        self.requests: dict[tuple[str, str], int] = {}
        self.retries: dict[str, int] = {}
        self.kv_releases: dict[str, int] = {}
        self.connections: Any = None  # connections.Connections, set by the app

    def attach_state(self, engines: Sequence[Engine], journal: Journal,
                     inflight: Callable[[], int], leadership: Leadership,
                     scheduler: CurvePriced | None = None,
                     roles: RoleController | None = None) -> None:
        self.registry.register(_Families(self, engines, journal, inflight, leadership,
                                         scheduler, roles))

    def request(self, route: str, outcome: str) -> None:
        key = (route, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1

    def settled(self, route: str, outcome: str, ttft_s: float | None, tpot_s: float | None,
                handoff_s: float | None) -> None:
        """One request settled: its outcome counted, the latencies it had observed."""
        self.request(route, outcome)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        if handoff_s is not None:
            self.handoff.observe(handoff_s)

    def retry(self, leg: str) -> None:
        self.retries[leg] = self.retries.get(leg, 0) + 1

    def kv_release(self, outcome: str) -> None:
        """A one-token leg sent to free the KV a refused decode leg left on its producer."""
        self.kv_releases[outcome] = self.kv_releases.get(outcome, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def watch_loop_lag(self, period_s: float = 0.25) -> None:
        """Measure how late the loop runs a timer; a busy or blocked loop shows up here."""
        while True:
            start = time.monotonic()
            await asyncio.sleep(period_s)
            self.loop_lag.observe(max(0.0, time.monotonic() - start - period_s))


class _Families(Collector):
    """Builds every family at scrape time from the counters and the live objects."""

    def __init__(self, metrics: RouterMetrics, engines: Sequence[Engine], journal: Journal,
                 inflight: Callable[[], int], leadership: Leadership,
                 scheduler: CurvePriced | None, roles: RoleController | None) -> None:
        self._lead = leadership
        self._roles = roles
        self._scheduler = scheduler
        self._m = metrics
        self._engines = engines
        self._journal = journal
        self._inflight = inflight

    def collect(self) -> Iterable[Any]:
        m = self._m
        requests = CounterMetricFamily("narwhal_router_requests",
                                       "Client requests by route and outcome",
                                       labels=["route", "outcome"])
        for (route, outcome), n in sorted(m.requests.items()):
            requests.add_metric([route, outcome], float(n))
        yield requests
        retries = CounterMetricFamily("narwhal_router_leg_retries",
                                      "Legs retried on another engine", labels=["leg"])
        for leg, n in sorted(m.retries.items()):
            retries.add_metric([leg], float(n))
        yield retries
        releases = CounterMetricFamily(
            "narwhal_router_kv_releases", "One-token legs sent to free the KV a refused decode "
            "leg left on its producer, by outcome (sent, ok, failed)", labels=["outcome"])
        for outcome, n in sorted(m.kv_releases.items()):
            releases.add_metric([outcome], float(n))
        yield releases
        if m.connections is not None:
            c = m.connections
            yield GaugeMetricFamily("narwhal_router_client_connections",
                                    "Open client connections", value=float(len(c)))
            closed = CounterMetricFamily(
                "narwhal_router_client_connections_closed",
                "Client connections the router closed or refused to protect its limits",
                labels=["reason"])
            for reason, n in (("evicted_idlest", c.evicted), ("refused_full", c.refused),
                              ("read_timeout", c.timed_out), ("idle_timeout", c.idle_closed)):
                closed.add_metric([reason], float(n))
            yield closed
        for hist in (m.ttft, m.tpot, m.handoff, m.loop_lag):
            yield hist.family()
        yield from self._engine_families()
        yield from self._pool_families()
        yield from self._lease_families()
        yield from self._scheduler_families()
        yield from self._role_families()
        yield GaugeMetricFamily("narwhal_router_inflight_requests", "Requests being served",
                                value=float(self._inflight()))
        j = self._journal
        yield CounterMetricFamily("narwhal_router_journal_rows", "Journal rows written",
                                  value=float(j.written))
        yield CounterMetricFamily("narwhal_router_journal_dropped_rows",
                                  "Journal rows dropped because the writer queue was full",
                                  value=float(j.dropped))
        yield GaugeMetricFamily("narwhal_router_journal_queued_rows",
                                "Rows waiting for the journal writer", value=float(j.queued))

    def _lease_families(self) -> Iterable[Any]:
        lead = self._lead
        yield GaugeMetricFamily("narwhal_router_lease_epoch",
                                "Fencing epoch of the controller lease this router holds (0: none)",
                                value=float(lead.epoch))
        role = GaugeMetricFamily("narwhal_router_controller_role",
                                 "1 for this router's current role", labels=["role"])
        for name in ("primary", "standby", "fenced"):
            role.add_metric([name], 1.0 if lead.role == name else 0.0)
        yield role
        yield CounterMetricFamily("narwhal_router_lease_renewals", "Lease renewals that succeeded",
                                  value=float(lead.renewals))

    def _scheduler_families(self) -> Iterable[Any]:
        sched = self._scheduler
        if sched is None:  # least-outstanding placement admits everything it can place
            return
        decisions = CounterMetricFamily("narwhal_router_admission_decisions",
                                        "Predictive admission: requests admitted; refused (429) "
                                        "because no placement met the TTFT budget; refused "
                                        "near capacity because the tenant was over its share; "
                                        "refused because no decode engine kept the TPOT budget",
                                        labels=["decision"])
        decisions.add_metric(["admitted"], float(sched.admitted))
        decisions.add_metric(["refused"], float(sched.refused))
        decisions.add_metric(["refused_over_share"], float(sched.refused_over_share))
        decisions.add_metric(["refused_tpot"], float(sched.refused_tpot))
        yield decisions
        overflow = CounterMetricFamily("narwhal_router_overflow_placements",
                                       "Requests admitted whole (one plain request) on a both "
                                       "engine of the other pool: the prefill pool could not "
                                       "meet TTFT (to_decode_pool), or no decode engine kept "
                                       "the TPOT budget (to_prefill_pool)",
                                       labels=["pool"])
        overflow.add_metric(["to_decode_pool"], float(sched.overflow_to_decode_pool))
        overflow.add_metric(["to_prefill_pool"], float(sched.overflow_to_prefill_pool))
        yield overflow
        queue = GaugeMetricFamily("narwhal_router_engine_prefill_queue_seconds",
                                  "Predicted seconds of prefill queued on the engine",
                                  labels=["engine"])
        for engine_id, seconds in sched.state()["prefill_queue_s"].items():
            queue.add_metric([engine_id], float(seconds))
        yield queue

    def _role_families(self) -> Iterable[Any]:
        roles = self._roles
        if roles is None:  # no role_flips section: every engine keeps its document role
            return
        flips = CounterMetricFamily("narwhal_router_role_flips",
                                    "Role flips of 'both' engines between the prefill and "
                                    "decode pools", labels=["from", "to"])
        for pair in (("decode", "prefill"), ("prefill", "decode")):
            flips.add_metric(list(pair), float(roles.flips.get(pair, 0)))
        yield flips
        current = GaugeMetricFamily("narwhal_router_engine_current_role",
                                    "1 for the role a 'both' engine holds now",
                                    labels=["engine", "role"])
        for engine in roles.members:
            current.add_metric([engine.id, roles.role_of(engine)], 1.0)
        yield current

    def _pool_families(self) -> Iterable[Any]:
        """Pool sizes always; SLO-relative loads once the role controller has computed them."""
        family = GaugeMetricFamily("narwhal_router_pool_engines",
                                   "Engines by what they take now: prefill and decode (placeable, "
                                   "a both engine in each), draining (leaving the decode pool), "
                                   "ejected, held", labels=["pool"])
        for pool, ids in pools(self._engines).items():
            family.add_metric([pool], float(len(ids)))
        yield family
        roles = self._roles
        if roles is None:
            return
        loads = GaugeMetricFamily("narwhal_router_pool_load",
                                  "Pool load relative to its SLO budget (1 = at the budget)",
                                  labels=["pool"])
        loads.add_metric(["prefill"], float(roles.prefill_load))
        loads.add_metric(["decode"], float(roles.decode_load))
        yield loads
        if roles.target_prefill is not None:
            yield GaugeMetricFamily("narwhal_router_planner_target_prefill_engines",
                                    "The planner's target size of the prefill pool",
                                    value=float(roles.target_prefill))

    def _engine_families(self) -> Iterable[Any]:
        admitted = GaugeMetricFamily("narwhal_router_engine_admitted",
                                     "1 while the engine may receive legs, 0 while ejected",
                                     labels=["engine", "role"])
        outstanding = GaugeMetricFamily("narwhal_router_engine_outstanding_legs",
                                        "Legs in flight on the engine", labels=["engine"])
        ejections = CounterMetricFamily("narwhal_router_engine_ejections",
                                        "Times the engine was ejected after a failure streak",
                                        labels=["engine"])
        held = GaugeMetricFamily("narwhal_router_engine_held",
                                 "1 while a healthy engine is held out of placement, by reason "
                                 "(reprofile: its live generation differs from its profile)",
                                 labels=["engine", "reason"])
        for e in self._engines:
            admitted.add_metric([e.spec.id, e.spec.role], 1.0 if e.placeable else 0.0)
            if e.held:
                held.add_metric([e.spec.id, e.held], 1.0)
            outstanding.add_metric([e.spec.id], float(e.outstanding))
            ejections.add_metric([e.spec.id], float(e.ejections))
        yield admitted
        yield held
        yield outstanding
        yield ejections
