"""``pdserve_kv_transfer_*``: one transfer endpoint's ``TransferMetrics``, read at scrape time.

The decode worker's receiver counts by its transport; the prefill worker's sender speaks every
transport it has a connector for and counts them together (``transport="all"``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from engine.metrics import LATENCY_BUCKETS_S, Histogram
from kv_transfer.metrics import TransferMetrics
from kv_transfer.reservations import ReleaseReason
from pdserve.metrics.families import HistogramFamily
from protos.pdserve.v1 import kv_transfer_pb2 as pb

# Exposed at 0 before the first occurrence, so rates and alerts have a series to work on.
_REFUSALS = tuple(
    name for name in pb.KVStatus.keys() if name not in ("KV_STATUS_UNSPECIFIED", "KV_STATUS_OK")
)
_FAILURES = {
    "receive": tuple(r.value for r in ReleaseReason),
    "send": ("PeerLostError", "TransferTimeoutError", *_REFUSALS),
}


class TransferCollector:
    """Exposes ``metrics`` labelled ``role``, ``model``, ``transport`` and ``side``."""

    def __init__(
        self, metrics: TransferMetrics, role: str, model: str, transport: str, side: str
    ) -> None:
        if side not in _FAILURES:
            raise ValueError(f"side must be 'send' or 'receive', got {side!r}")
        self._metrics = metrics
        self._side = side
        self._labels = {"role": role, "model": model, "transport": transport, "side": side}
        self._seconds = Histogram(LATENCY_BUCKETS_S)
        metrics.subscribe(lambda seconds, _num_bytes: self._seconds.observe(seconds))

    def collect(self) -> Iterator[Metric]:
        names = list(self._labels)
        values = list(self._labels.values())
        snap = self._metrics.snapshot()
        for name, doc, value in (
            ("pdserve_kv_transfer_bytes", "KV bytes moved.", snap.bytes_transferred),
            ("pdserve_kv_transfer_blocks", "KV blocks moved.", snap.blocks_transferred),
            (
                "pdserve_kv_transfer_skipped_blocks",
                "Blocks decode already held (prefix cache), never sent.",
                snap.blocks_skipped,
            ),
            ("pdserve_kv_transfers", "Completed request transfers.", snap.transfers_completed),
        ):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            yield c
        failures = CounterMetricFamily(
            "pdserve_kv_transfer_failures",
            "Transfers that ended without completing, by reason (receive: why the reservation "
            "was released; send: the error or refusal status).",
            labels=[*names, "reason"],
        )
        for reason in sorted(set(_FAILURES[self._side]) | set(snap.failures)):
            failures.add_metric([*values, reason], snap.failures.get(reason, 0))
        yield failures
        refused = CounterMetricFamily(
            "pdserve_kv_transfer_refused_writes",
            "Writes the receiver refused (never applied to the pool), by KV status.",
            labels=[*names, "status"],
        )
        for status in sorted(set(_REFUSALS) | set(snap.refused_writes)):
            refused.add_metric([*values, status], snap.refused_writes.get(status, 0))
        yield refused
        h = HistogramFamily(
            "pdserve_kv_transfer_seconds",
            "Duration of one request's KV transfer (send: open -> last block acknowledged; "
            "receive: reservation -> complete).",
            names,
        )
        h.add(self._labels, self._seconds.snapshot())
        yield h.family
