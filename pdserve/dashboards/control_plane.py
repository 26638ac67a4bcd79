"""The control-plane row (on the capacity dashboard): the registry as the routers see it,
lease renewals and fencing on the workers, stale load reports, the cluster KV index, routing
decisions by reason and by worker, and conflicts between routers."""

from __future__ import annotations

from pdserve.dashboards.panels import SEL, Panel, Row, Target, rate

PANELS: tuple[Panel | Row, ...] = (
    Row("Control plane (registry, routing, cluster KV index)"),
    Panel(
        "Registered workers by role and state",
        "short",
        (
            Target(
                f"max by (worker_role, state) (pdserve_registry_workers{{{SEL}}})",
                "{{worker_role}} {{state}}",
            ),
        ),
        "Workers the routers know (the most any router knows: every router follows the same "
        "registry; a router that knows fewer shows in its own series on /metrics).",
        width=8,
    ),
    Panel(
        "Routing decisions per second by reason",
        "short",
        (rate("pdserve_router_routing_decisions_total", SEL, "reason"),),
        "kv_hit: the prefill worker cached part of the prompt; load: nothing cached, the "
        "least-loaded pair; local_prefill: decode prefilled the prompt itself; "
        "retry_other_worker: a busy decode worker's request went to the next one.",
        width=8,
    ),
    Panel(
        "Requests routed per worker per second",
        "short",
        (rate("pdserve_router_routed_requests_total", SEL, "worker_role, worker_id"),),
        "Summed over the routers: how evenly the pools share the traffic.",
        width=8,
    ),
    Panel(
        "Lease renew failures and stale load reports",
        "short",
        (
            rate(
                "pdserve_worker_lease_renew_failures_total",
                SEL,
                "role",
                "lease renew failures {{role}}",
            ),
            rate(
                "pdserve_router_stale_load_reports_total",
                SEL,
                "instance",
                "stale reports {{instance}}",
            ),
        ),
        "Per second. Renew failures: a worker's heartbeat did not reach Redis (it keeps "
        "serving). Stale: a router routed on its own counts because a report was too old.",
        width=8,
    ),
    Panel(
        "Cluster KV index size",
        "short",
        (
            Target(
                f"max by (instance) (pdserve_kv_index_blocks{{{SEL}}})",
                "{{instance}}",
            ),
        ),
        "Block hashes in each router's index of the workers' prefix caches.",
        width=8,
    ),
    Panel(
        "KV event lag",
        "s",
        (
            Target(
                f"max by (instance) (pdserve_kv_index_event_lag_seconds{{{SEL}}})",
                "{{instance}}",
            ),
        ),
        "Age of the newest KV event batch when the router applied it.",
        width=8,
    ),
    Panel(
        "Cross-router conflicts and fencing",
        "short",
        (
            rate(
                "pdserve_router_cross_router_conflicts_total",
                SEL,
                "instance",
                "conflicts {{instance}}",
            ),
            rate("pdserve_worker_fenced_total", SEL, "role", "fenced {{role}}"),
            rate("pdserve_control_plane_outages_total", SEL, "instance", "outages {{instance}}"),
        ),
        "Per second. Conflicts: another router's reservation moved a send off this router's "
        "first choice. Fenced: a restarted worker with the same id fenced its old process. "
        "Outages: Redis stopped answering a router (it keeps routing on what it knows).",
        width=8,
    ),
)
