"""Prometheus metrics of a worker's side of the control plane, read from its
``ControlPlaneStats`` at scrape time: lease renewals that did not reach Redis, registrations
made again (the record was gone: a lapsed lease or a Redis restart), fencing by a newer
process with the same worker id, and Redis outages. A worker without Redis (static routers)
reports zeros and ``pdserve_worker_registered`` 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from control_plane.stats import ControlPlaneStats
from pdserve.metrics.families import Families


class WorkerControlPlaneCollector:
    def __init__(
        self, stats: ControlPlaneStats, is_registered: Callable[[], bool], role: str, model: str
    ) -> None:
        self._stats = stats
        self._is_registered = is_registered
        self._families = Families(["role", "model"], [role, model])

    def collect(self) -> Iterator[Metric]:
        s, f = self._stats, self._families
        yield f.gauge(
            "pdserve_worker_registered",
            "1 while this worker holds a live registration in the Redis registry.",
            1.0 if self._is_registered() else 0.0,
        )
        yield f.counter(
            "pdserve_worker_lease_renew_failures",
            "Registry heartbeats (lease renewals) that did not reach Redis.",
            s.lease_renew_failures,
        )
        yield f.counter(
            "pdserve_worker_reregistrations",
            "Registrations made again because the record was gone (lease lapsed, Redis restarted).",
            s.reregistrations,
        )
        yield f.counter(
            "pdserve_worker_fenced",
            "Times a newer process registered this worker id (this one stops writing).",
            s.fenced,
        )
        yield f.counter(
            "pdserve_worker_control_plane_outages",
            "Redis outages seen by this worker (each once).",
            s.outages,
        )
