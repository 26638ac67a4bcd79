"""The capacity dashboard: KV cache, queues, preemption, batch size, prefix hits, request
migrations, and the control-plane row (pdserve.dashboards.control_plane)."""

from __future__ import annotations

from pdserve.dashboards import control_plane
from pdserve.dashboards.panels import POOL, RI, SEL, Panel, Row, Target, mean, quantiles, rate

TITLE = "pdserve / capacity"

PANELS: tuple[Panel | Row, ...] = (
    Panel(
        "KV cache usage",
        "percentunit",
        (
            Target(
                f"max by (role, instance) (pdserve_engine_kv_usage_ratio{{{POOL}}})",
                "{{role}} {{instance}}",
            ),
        ),
        "Fraction of device KV blocks in use per worker.",
        extra={"max": 1},
    ),
    Panel(
        "Host (swap) KV usage",
        "percentunit",
        (
            Target(
                f"max by (role, instance) (pdserve_engine_kv_host_usage_ratio{{{POOL}}})",
                "{{role}} {{instance}}",
            ),
        ),
    ),
    Panel(
        "Requests in engines (queue depth)",
        "short",
        (
            Target(
                f"sum by (role, state) (pdserve_engine_requests{{{POOL}}})",
                "{{role}} {{state}}",
            ),
        ),
    ),
    Panel(
        "Router in flight",
        "short",
        (
            Target(f"sum(pdserve_router_inflight_requests{{{SEL}}})", "in flight"),
            Target(f"sum(pdserve_router_max_inflight_requests{{{SEL}}})", "limit"),
        ),
    ),
    Panel(
        "Preemptions per second",
        "short",
        (rate("pdserve_engine_preemptions_total", POOL, "role, mode"),),
    ),
    Panel(
        "Blocks swapped per second",
        "short",
        (rate("pdserve_engine_swapped_blocks_total", POOL, "role, direction"),),
    ),
    Panel(
        "Batch size (tokens per step)",
        "short",
        (
            *quantiles("pdserve_engine_step_tokens", POOL, "role", (0.5, 0.95)),
            mean("pdserve_engine_step_requests", POOL, "role"),
        ),
        "Tokens computed per engine step (prefill chunks + decodes); the last series is the "
        "mean number of requests per step.",
    ),
    Panel(
        "Step time",
        "s",
        quantiles("pdserve_engine_step_seconds", POOL, "role", (0.5, 0.95)),
    ),
    Panel(
        "Prefix cache hit rate",
        "percentunit",
        (
            Target(
                rate("pdserve_engine_prefix_cache_hit_blocks_total", POOL, "role").expr
                + " / "
                + rate("pdserve_engine_prefix_cache_query_blocks_total", POOL, "role").expr,
                "{{role}}",
            ),
        ),
        "Prompt blocks served from the prefix cache over blocks looked up.",
    ),
    Panel(
        "Healthy workers (router's view)",
        "short",
        (Target(f"sum by (pool) (pdserve_router_healthy_workers{{{SEL}}})", "{{pool}}"),),
    ),
    Panel(
        "Request migrations per second",
        "short",
        (
            rate("pdserve_migrations_total", SEL, "phase, reason"),
            Target(
                f"sum(rate(pdserve_migrations_failed_total{{{SEL}}}[{RI}]))",
                "failed (no worker left or --migration-limit reached)",
            ),
        ),
        "Requests the router moved to other workers after the ones serving them died, "
        "stalled or drained (phase prefill: before the attempt's first token), and requests "
        "it could not move.",
    ),
    Panel(
        "Engine steps per second",
        "short",
        (rate("pdserve_engine_steps_total", POOL, "role"),),
    ),
    Panel(
        "Tokens sampled per second per pool",
        "short",
        (rate("pdserve_engine_generation_tokens_total", POOL, "role"),),
    ),
    Panel(
        "Processes by version and kernels",
        "short",
        (
            Target(
                f"count by (role, version, attention_backend) (pdserve_build_info{{{SEL}}})",
                "{{role}} {{version}} {{attention_backend}}",
            ),
        ),
        "pdserve processes by version (the mix during a rollout) and, for engines, attention "
        "backend: cpu = the compiled CPU kernels, torch = the fallback when they could not "
        "build (slower), triton on GPUs.",
    ),
    *control_plane.PANELS,
)
