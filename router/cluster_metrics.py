"""Prometheus metrics of the router's control plane, read from ``ClusterRouter`` at scrape
time: registry size by role and state, routing decisions by reason, cross-router conflicts,
stale load reports, the KV index's size and event lag, KV snapshots, refused workers and
Redis outages."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pdserve.metrics.families import Families
from router.cluster_router import ClusterRouter


class ClusterCollector:
    def __init__(self, cluster: ClusterRouter, role: str, model: str) -> None:
        self._cluster = cluster
        self._labels = {"role": role, "model": model}

    def collect(self) -> Iterator[Metric]:
        names, values = list(self._labels), list(self._labels.values())
        view, stats = self._cluster.view, self._cluster.stats
        registry = GaugeMetricFamily(
            "pdserve_registry_workers",
            "Workers the router knows, by role and state (serving, draining).",
            labels=[*names, "worker_role", "state"],
        )
        for (role, state), n in sorted(view.registry_size().items()):
            registry.add_metric([*values, role, state], n)
        yield registry
        decisions = CounterMetricFamily(
            "pdserve_router_routing_decisions",
            "Routing decisions by reason (kv_hit, load, local_prefill, round_robin, "
            "retry_other_worker).",
            labels=[*names, "reason"],
        )
        for reason, n in sorted(stats.routing_decisions.items()):
            decisions.add_metric([*values, reason], n)
        yield decisions
        routed = CounterMetricFamily(
            "pdserve_router_routed_requests",
            "Requests sent to each worker (a retry on another decode worker counts there too).",
            labels=[*names, "worker_role", "worker_id"],
        )
        for (role, worker_id), n in sorted(stats.routed_requests.items()):
            routed.add_metric([*values, role, worker_id], n)
        yield routed

        families = Families(names, values)
        gauge, counter = families.gauge, families.counter

        yield counter(
            "pdserve_router_cross_router_conflicts",
            "Sends another router's reservation moved off this router's first choice.",
            stats.cross_router_conflicts,
        )
        yield counter(
            "pdserve_router_stale_load_reports",
            "Routing reads of a worker whose load report was too old (own sends used instead).",
            stats.stale_load_reports,
        )
        yield gauge(
            "pdserve_kv_index_blocks",
            "Block hashes in the router's cluster KV index.",
            len(view.kv_index),
        )
        yield gauge(
            "pdserve_kv_index_event_lag_seconds",
            "Age of the newest KV event batch when the router applied it.",
            stats.kv_event_lag_s,
        )
        yield counter(
            "pdserve_kv_index_snapshots",
            "KV snapshots taken (a gap in a worker's events, or a new generation).",
            stats.kv_snapshots,
        )
        yield counter(
            "pdserve_registry_refused_workers",
            "Workers refused for a different model or KV layout.",
            stats.fingerprint_mismatches,
        )
        yield counter("pdserve_control_plane_outages", "Redis outages (each once).", stats.outages)
        yield counter(
            "pdserve_control_plane_outage_seconds",
            "Time spent in finished Redis outages.",
            stats.outage_seconds,
        )
