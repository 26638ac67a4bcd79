"""Generate pdserve's Grafana dashboards (plain JSON, Grafana 10/11 schema) from one table.

    python helm/dashboards/generate.py           # rewrite helm/dashboards/*.json
    python helm/dashboards/generate.py --check   # exit 1 if a JSON file is stale

Every panel query uses the template variables ``$namespace``, ``$model`` (and ``$pool``, the
engine ``role``: prefill, decode, colocated where it applies) and Grafana's
``$__rate_interval``. tests/observability/test_prometheus.py evaluates each query against a
Prometheus scraping live pdserve processes: a panel that shows nothing fails it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", model=~"$model"'
POOL = SEL + ', role=~"$pool"'
RI = "$__rate_interval"
DONE = SEL + ', reason=~"stop|length"'  # finished normally


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    kind: str = "timeseries"  # or "stat"
    width: int = 12
    extra: dict[str, Any] = field(default_factory=dict)


def quantiles(
    metric: str, sel: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95, 0.99)
) -> tuple[Target, ...]:
    """p50/p95/p99 of a histogram, optionally per ``by`` label."""
    group = f"le, {by}" if by else "le"
    prefix = "{{" + by + "}} " if by else ""
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{sel}}}[{RI}])))",
            f"{prefix}p{int(q * 100)}",
        )
        for q in qs
    )


def mean(metric: str, sel: str, by: str) -> Target:
    return Target(
        f"sum by ({by}) (rate({metric}_sum{{{sel}}}[{RI}]))"
        f" / sum by ({by}) (rate({metric}_count{{{sel}}}[{RI}]))",
        "{{" + by + "}}",
    )


def rate(metric: str, sel: str, by: str, legend: str | None = None) -> Target:
    return Target(
        f"sum by ({by}) (rate({metric}{{{sel}}}[{RI}]))",
        legend if legend is not None else "{{" + by.replace(", ", "}} {{") + "}}",
    )


SLO_OVERVIEW = (
    Panel(
        "Requests per second by outcome",
        "reqps",
        (
            rate("pdserve_request_finished_total", SEL, "reason"),
            rate("pdserve_request_rejected_total", SEL, "reason", "rejected {{reason}}"),
        ),
        "Ended requests by finish reason, and refusals by reason (router).",
    ),
    Panel(
        "Goodput (requests meeting every SLO)",
        "percentunit",
        (
            Target(
                f"sum(rate(pdserve_goodput_requests_total{{{SEL}}}[{RI}]))"
                f" / sum(rate(pdserve_request_finished_total{{{DONE}}}[{RI}]))",
                "goodput ratio",
            ),
        ),
        "Finished requests within --slo-ttft-ms and --slo-itl-ms, over all finished requests.",
        kind="stat",
        width=6,
    ),
    Panel(
        "Goodput tokens per second",
        "short",
        (
            Target(f"sum(rate(pdserve_goodput_tokens_total{{{SEL}}}[{RI}]))", "goodput"),
            Target(f"sum(rate(pdserve_request_generation_tokens_total{{{SEL}}}[{RI}]))", "all"),
        ),
        width=6,
    ),
    Panel(
        "Time to first token",
        "s",
        quantiles("pdserve_request_ttft_seconds", SEL),
        "From arrival at the router to the first token it sends.",
    ),
    Panel(
        "Inter-token latency",
        "s",
        quantiles("pdserve_request_inter_token_latency_seconds", SEL),
        "Time between consecutive token deliveries of a request (router).",
    ),
    Panel(
        "Time per output token (finished requests)",
        "s",
        quantiles("pdserve_request_time_per_output_token_seconds", SEL),
    ),
    Panel("End-to-end latency", "s", quantiles("pdserve_request_e2e_seconds", SEL)),
    Panel(
        "TTFT breakdown (mean per stage)",
        "s",
        (mean("pdserve_request_ttft_stage_seconds", SEL, "stage"),),
        "router_queue (router), prefill_queue and prefill_compute (the engine that "
        "prefilled), kv_transfer (prefill: first token -> last block acknowledged), "
        "decode_admission (decode: KV complete -> first token sent).",
        extra={"stack": True},
    ),
    Panel(
        "Queue time per pool",
        "s",
        quantiles("pdserve_request_ttft_stage_seconds", POOL + ', stage="prefill_queue"', "role"),
        "Engine queue: arrival -> first scheduled, per pool (local prefills only).",
    ),
    Panel(
        "SLO error ratio (5m)",
        "percentunit",
        (
            Target(
                'pdserve:slo_ttft_error_ratio:rate5m{namespace=~"$namespace", model=~"$model"}',
                "ttft",
            ),
            Target(
                'pdserve:slo_itl_error_ratio:rate5m{namespace=~"$namespace", model=~"$model"}',
                "itl",
            ),
        ),
        "Share of requests missing the TTFT / ITL SLO (recording rules; 1% is the budget).",
    ),
    Panel(
        "Error and rejection ratio",
        "percentunit",
        (
            Target(
                f'sum(rate(pdserve_request_finished_total{{{SEL}, reason=~"error|timeout"}}[{RI}]))'
                f" / sum(rate(pdserve_request_finished_total{{{SEL}}}[{RI}]))",
                "errors",
            ),
            Target(
                f"sum(rate(pdserve_request_rejected_total{{{SEL}}}[{RI}]))"
                f" / (sum(rate(pdserve_request_rejected_total{{{SEL}}}[{RI}]))"
                f" + sum(rate(pdserve_request_finished_total{{{SEL}}}[{RI}])))",
                "rejected",
            ),
        ),
    ),
    Panel(
        "Tokens per second",
        "short",
        (
            Target(f"sum(rate(pdserve_request_prompt_tokens_total{{{SEL}}}[{RI}]))", "prompt"),
            Target(
                f"sum(rate(pdserve_request_generation_tokens_total{{{SEL}}}[{RI}]))", "generation"
            ),
        ),
    ),
)

CAPACITY = (
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
        "Engine steps per second",
        "short",
        (rate("pdserve_engine_steps_total", POOL, "role"),),
    ),
    Panel(
        "Tokens sampled per second per pool",
        "short",
        (rate("pdserve_engine_generation_tokens_total", POOL, "role"),),
    ),
)

TRANSFER = (
    Panel(
        "KV transfer bandwidth",
        "Bps",
        (rate("pdserve_kv_transfer_bytes_total", SEL, "side, transport"),),
        "Bytes per second sent (prefill) and received (decode).",
    ),
    Panel(
        "Blocks per second",
        "short",
        (
            rate("pdserve_kv_transfer_blocks_total", SEL, "side", "sent/received {{side}}"),
            rate("pdserve_kv_transfer_skipped_blocks_total", SEL, "side", "skipped {{side}}"),
        ),
        "Skipped: blocks decode already held from its prefix cache.",
    ),
    Panel(
        "Transfer latency per request",
        "s",
        quantiles("pdserve_kv_transfer_seconds", SEL, "side"),
        "send: open -> last block acknowledged; receive: reservation -> complete.",
    ),
    Panel(
        "KV transfer stage of TTFT",
        "s",
        quantiles("pdserve_request_ttft_stage_seconds", SEL + ', stage="kv_transfer"'),
        "The part of the transfer that is not overlapped with prefill compute.",
    ),
    Panel(
        "Transfers completed per second",
        "short",
        (rate("pdserve_kv_transfers_total", SEL, "side, transport"),),
    ),
    Panel(
        "Transfer failures per second",
        "short",
        (rate("pdserve_kv_transfer_failures_total", SEL, "side, reason"),),
        "receive: why a reservation was released (aborted = client went away); "
        "send: the error or refusal.",
    ),
    Panel(
        "Refused writes per second",
        "short",
        (rate("pdserve_kv_transfer_refused_writes_total", SEL, "status"),),
    ),
)

DASHBOARDS = {
    "slo-overview": ("pdserve / SLO overview", SLO_OVERVIEW),
    "capacity": ("pdserve / capacity", CAPACITY),
    "transfer": ("pdserve / KV transfer", TRANSFER),
}


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    q = f"label_values({query}, {label})"
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DS,
        "definition": q,
        "query": {"query": q, "refId": f"var-{name}", "qryType": 1},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
    if p.extra.get("stack"):
        custom["stacking"] = {"mode": "normal", "group": "A"}
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.kind == "timeseries":
        defaults["custom"] = custom
    if "max" in p.extra:
        defaults["max"] = p.extra["max"]
        defaults["min"] = 0
    panel: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": t.expr, "legendFormat": t.legend}
            for i, t in enumerate(p.targets)
        ],
    }
    if p.kind == "timeseries":
        panel["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}
        }
    return panel


def build(uid: str, title: str, panels: tuple[Panel, ...]) -> dict[str, Any]:
    laid_out, x, y = [], 0, 0
    for i, p in enumerate(panels, start=1):
        if x + p.width > 24:
            x, y = 0, y + 8
        laid_out.append(_panel(p, i, x, y))
        x += p.width
    engine = "pdserve_engine_steps_total"
    return {
        "uid": f"pdserve-{uid}",
        "title": title,
        "tags": ["pdserve"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("namespace", "namespace", engine),
                _variable("model", "model", f'{engine}{{namespace=~"$namespace"}}'),
                _variable("pool", "role", f'{engine}{{namespace=~"$namespace", model=~"$model"}}'),
            ]
        },
        "panels": laid_out,
    }


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {
        f"{uid}.json": json.dumps(build(uid, title, panels), indent=2) + "\n"
        for uid, (title, panels) in DASHBOARDS.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python helm/dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
