"""Turning plain-Python snapshots into Prometheus metric families."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine.metrics import HistogramSnapshot


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class HistogramFamily:
    """Accumulates labelled ``HistogramSnapshot``s into one ``HistogramMetricFamily``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.family = HistogramMetricFamily(name, documentation, labels=list(labelnames))

    def add(self, labels: Mapping[str, str], snap: HistogramSnapshot) -> None:
        buckets = [(_le(bound), float(n)) for bound, n in snap.cumulative()]
        self.family.add_metric(list(labels.values()), buckets, snap.sum)


class Families:
    """``Families(names, values).gauge(name, doc, value)``: a family with one sample."""

    def __init__(self, names: Sequence[str], values: Sequence[str]) -> None:
        self._names, self._values = list(names), list(values)

    def gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=self._names)
        g.add_metric(self._values, value)
        return g

    def counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=self._names)
        c.add_metric(self._values, value)
        return c
