"""Lock-free counters, gauges and histograms for the request path, exposed by one collector.

prometheus_client's own metrics take a lock on every `inc`, `set` and `observe`; an engine
emulator makes a dozen such calls per request and one or more per scheduler step, all on one
event-loop thread, so the locks are pure cost when a router benchmark drives zero-delay
emulators. Here an update is a plain attribute add (a histogram adds a `bisect`), and the
values become prometheus_client metric families only when /metrics is scraped. The exposition
is prometheus_client's, so the text (`_total`, `_bucket{le=...}`, `_created`) is what its own
metrics would print. Single-threaded by design: use only from the engine's event loop.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class Value:
    """A counter or gauge series: `inc` and `set` are attribute updates."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = value


class Buckets:
    """A histogram series: per-bucket counts (not cumulative) and the sum."""

    __slots__ = ("counts", "edges", "total")

    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.counts = [0] * (len(edges) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.edges, value)] += 1
        self.total += value


@dataclass
class _Family:
    kind: str  # "counter", "gauge" or "histogram"
    name: str
    doc: str
    labelnames: list[str]
    edges: tuple[float, ...] = ()
    series: list[tuple[list[str], Value | Buckets]] = field(default_factory=list)
    created: float = field(default_factory=time.time)


class FastRegistry(Collector):
    """Families in registration order; register it once in a CollectorRegistry."""

    def __init__(self) -> None:
        self._families: list[_Family] = []

    def _family(self, kind: str, name: str, doc: str, labelnames: Sequence[str],
                edges: tuple[float, ...] = ()) -> _Family:
        family = _Family(kind, name, doc, list(labelnames), edges)
        self._families.append(family)
        return family

    def counter(self, name: str, doc: str, labelnames: Sequence[str],
                values: Sequence[Sequence[str]]) -> list[Value]:
        """One family, one series per label-value tuple in `values` (same order)."""
        return self._values(self._family("counter", name, doc, labelnames), values)

    def gauge(self, name: str, doc: str, labelnames: Sequence[str],
              values: Sequence[Sequence[str]]) -> list[Value]:
        return self._values(self._family("gauge", name, doc, labelnames), values)

    def histogram(self, name: str, doc: str, labelnames: Sequence[str],
                  values: Sequence[str], edges: tuple[float, ...]) -> Buckets:
        family = self._family("histogram", name, doc, labelnames, edges)
        series = Buckets(edges)
        family.series.append((list(values), series))
        return series

    @staticmethod
    def _values(family: _Family, values: Sequence[Sequence[str]]) -> list[Value]:
        out = []
        for labels in values:
            series = Value()
            family.series.append((list(labels), series))
            out.append(series)
        return out

    def collect(self) -> Iterator[Metric]:
        for f in self._families:
            if f.kind == "counter":
                counter = CounterMetricFamily(f.name, f.doc, labels=f.labelnames)
                for labels, series in f.series:
                    assert isinstance(series, Value)
                    counter.add_metric(labels, series.value, created=f.created)
                yield counter
            elif f.kind == "gauge":
                gauge = GaugeMetricFamily(f.name, f.doc, labels=f.labelnames)
                for labels, series in f.series:
                    assert isinstance(series, Value)
                    gauge.add_metric(labels, series.value)
                yield gauge
            else:
                yield self._histogram(f)

    @staticmethod
    def _histogram(f: _Family) -> HistogramMetricFamily:
        family = HistogramMetricFamily(f.name, f.doc, labels=f.labelnames)
        # prometheus_client's own `le` spelling (2.097152e+06), so the text matches its metrics.
        names = [floatToGoString(e) for e in f.edges]  # type: ignore[no-untyped-call]
        names.append("+Inf")
        for labels, series in f.series:
            assert isinstance(series, Buckets)
            running, cumulative = 0, []
            for name, count in zip(names, series.counts, strict=True):
                running += count
                cumulative.append((name, float(running)))
            family.add_metric(labels, cumulative, series.total)
            family.add_sample(f.name + "_created", dict(zip(f.labelnames, labels, strict=True)),
                              f.created)
        return family
