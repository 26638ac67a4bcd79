"""Plain counters of the control plane, read by the Prometheus collectors at scrape time (no
prometheus call on a hot path). Each process has one ``ControlPlaneStats``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ControlPlaneStats:
    lease_renew_failures: int = 0  # worker: a heartbeat that did not reach Redis
    reregistrations: int = 0  # worker: the record was gone (lease lapsed, Redis restarted)
    fenced: int = 0  # worker: a newer registration of this id fenced this process
    stale_load_reports: int = 0  # router: a worker's report was too old when routing
    outages: int = 0  # Redis became unreachable (each outage once)
    outage_seconds: float = 0.0  # time spent in finished outages
    kv_snapshots: int = 0  # router: snapshots taken after a gap or a new generation
    kv_event_lag_s: float = 0.0  # router: age of the newest KV batch when it was applied
    cross_router_conflicts: int = 0  # router: another router's sends changed our choice
    fingerprint_mismatches: int = 0  # router: workers refused for a different model/layout
    routing_decisions: Counter[str] = field(default_factory=Counter)  # by reason
    # router: requests sent to each worker, by (role, worker id); retries count again
    routed_requests: Counter[tuple[str, str]] = field(default_factory=Counter)
