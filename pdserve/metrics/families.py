"""Turning plain-Python snapshots into Prometheus metric families."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.core import HistogramMetricFamily

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
