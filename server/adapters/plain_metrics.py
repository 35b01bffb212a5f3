"""Counters and histograms as plain numbers, exposed by a collector at scrape time.

Every step records a dozen observations (its compile's duration, tokens per layer, the
budget's use, its decision, the memo's outcome, its storage writes, its append, its usage
report). prometheus-client's own metrics take a lock per value changed (two per histogram
observation) and validate on each call: about 2 us an observation, tens per step. Here a
series is a list of bucket counts and a sum, changed by the caller under one lock that it
takes once for all it records (`PlainMetrics.lock`); the collector takes the same lock to
copy them when Prometheus scrapes. The exposition is what prometheus-client writes for
its own Counter and Histogram (the same names, labels, buckets, `_count` and `_sum`) but
for its `_created` samples: Prometheus stores each of those as a series of its own (473
of a fresh daemon's 1,098, on every sidecar of a fleet) and no rule or panel reads them.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

INF = float("inf")
# How prometheus-client writes a bucket's bound (`le`): 1.0, 0.0005, 1.048576e+06, +Inf.
_le = cast(Callable[[float], str], floatToGoString)


class HistogramSeries:
    """One label set of a histogram: counts per bucket (not cumulative) and the sum.
    `observe` is called holding the family's lock."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        self.total += amount
        # The first bucket whose bound is >= amount (prometheus-client: amount <= bound);
        # a NaN counts in no bucket, as there.
        i = bisect_left(self._bounds, amount)
        if i < len(self._bounds) and amount <= self._bounds[i]:
            self.counts[i] += 1


class CounterSeries:
    """One label set of a counter. `inc` is called holding the family's lock."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Family:
    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labels)

    def _checked(self, values: tuple[str, ...]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, given {values}")
        return values


class PlainHistogram(_Family):
    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        super().__init__(name, documentation, labels)
        bounds = tuple(float(b) for b in buckets)
        self.bounds = bounds if bounds[-1] == INF else (*bounds, INF)
        self.series: dict[tuple[str, ...], HistogramSeries] = {}

    def labels(self, *values: str) -> HistogramSeries:
        """The series of these label values, made on first use (under the lock)."""
        found = self.series.get(values)
        if found is None:
            found = self.series[self._checked(values)] = HistogramSeries(self.bounds)
        return found

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        names = [_le(b) for b in self.bounds]
        for values, s in self.series.items():
            running, buckets = 0, []
            for name, count in zip(names, s.counts, strict=True):
                running += count
                buckets.append((name, float(running)))
            family.add_metric(list(values), buckets, s.total)
        return family


class PlainCounter(_Family):
    def __init__(self, name: str, documentation: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labels)
        self.series: dict[tuple[str, ...], CounterSeries] = {}

    def labels(self, *values: str) -> CounterSeries:
        """The series of these label values, made on first use (under the lock)."""
        found = self.series.get(values)
        if found is None:
            found = self.series[self._checked(values)] = CounterSeries()
        return found

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, s in self.series.items():
            family.add_metric(list(values), s.value)
        return family


class PlainMetrics(Collector):
    """The families, one lock for all their series, and the collector that reads them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._families: list[PlainHistogram | PlainCounter] = []

    def histogram(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> PlainHistogram:
        family = PlainHistogram(name, documentation, labels, buckets)
        self._families.append(family)
        if not labels:
            family.labels()  # exposed from the start, as prometheus-client does
        return family

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> PlainCounter:
        family = PlainCounter(name, documentation, labels)
        self._families.append(family)
        if not labels:
            family.labels()
        return family

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            metrics = [f.metric() for f in self._families]
        yield from metrics
