"""Reports: the JSON file (summary and every request's record per load point) and the tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pdserve.bench.metrics import LatencyStats, Summary
from pdserve.bench.runner import BenchResult

REPORT_VERSION = 1


def to_json(result: BenchResult) -> dict[str, Any]:
    cap = result.capacity
    return {
        "version": REPORT_VERSION,
        "started_at": result.started_at,
        "model": result.model,
        "machine": result.machine,
        "config": result.config.to_dict(),
        "num_warmup": result.num_warmup,
        "capacity": None if cap is None else {"kind": cap.kind, "value": _num(cap.value)},
        "points": [
            {
                "load": {
                    "kind": p.result.load.kind,
                    "value": _num(p.result.load.value),
                    "max_concurrency": p.result.load.max_concurrency,
                },
                "is_slo_held": p.is_slo_held,
                "summary": p.summary.to_json(),
                "records": [r.to_json() for r in p.result.records],
                "bursts": None
                if p.bursts is None
                else {
                    "summary": p.bursts.summary.to_json(),
                    "records": [r.to_json() for r in p.bursts.records],
                },
            }
            for p in result.points
        ],
    }


def _num(v: float) -> float | str:
    return "inf" if math.isinf(v) else v  # JSON has no infinity


def write_json(result: BenchResult, path: Path) -> None:
    path.write_text(json.dumps(to_json(result), indent=1) + "\n", encoding="utf-8")


def _ms(s: LatencyStats | None, attr: str) -> str:
    return "-" if s is None else f"{getattr(s, attr):.1f}"


def summary_table(title: str, s: Summary) -> Table:
    """One load point: counts, throughput, and each latency's mean/p50/p95/p99."""
    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("completed/failed/cancelled", f"{s.num_completed}/{s.num_failed}/{s.num_cancelled}"),
        ("duration (s)", f"{s.duration_s:.2f}"),
        ("requests/s", f"{s.request_throughput:.2f}"),
        ("input tokens/s", f"{s.input_token_throughput:.1f}"),
        ("output tokens/s", f"{s.output_token_throughput:.1f}"),
        ("input / output tokens", f"{s.total_input_tokens} / {s.total_output_tokens}"),
    ]
    if s.total_cached_tokens is not None:
        rows.append(("cached prompt tokens", str(s.total_cached_tokens)))
    if s.goodput is not None:
        rows.append((f"goodput req/s ({s.slo})", f"{s.goodput:.2f}"))
        rows.append(("SLO attainment", f"{100 * (s.slo_attainment or 0.0):.1f}%"))
    for name, row in rows:
        t.add_row(name, row)
    top = sorted(s.errors.items(), key=lambda kv: -kv[1])
    for error, count in top[:3]:
        t.add_row(f"failed x{count}", error[:120])
    if len(top) > 3:
        t.add_row("failed", f"... {len(top) - 3} more distinct errors (results.json)")
    return t


def latency_table(s: Summary) -> Table:
    t = Table()
    t.add_column("latency (ms)")
    for col in ("mean", "p50", "p95", "p99", "n"):
        t.add_column(col, justify="right")
    latencies = (("TTFT", s.ttft_ms), ("ITL", s.itl_ms), ("TPOT", s.tpot_ms), ("E2E", s.e2e_ms))
    for name, st in latencies:
        row = [_ms(st, a) for a in ("mean", "p50", "p95", "p99")]
        t.add_row(name, *row, "0" if st is None else str(st.n))
    return t


def sweep_table(result: BenchResult) -> Table:
    """One row per load point."""
    t = Table(title=f"{result.model} @ {result.config.target.url}", title_justify="left")
    for col in (
        "load", "ok/fail/cxl", "req/s", "in tok/s", "out tok/s",
        "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT p50", "E2E p99", "goodput", "SLO",
    ):  # fmt: skip
        t.add_column(col, justify="left" if col == "load" else "right")
    for p in result.points:
        s = p.summary
        t.add_row(
            p.result.load.label,
            f"{s.num_completed}/{s.num_failed}/{s.num_cancelled}",
            f"{s.request_throughput:.2f}",
            f"{s.input_token_throughput:.1f}",
            f"{s.output_token_throughput:.1f}",
            _ms(s.ttft_ms, "p50"),
            _ms(s.ttft_ms, "p99"),
            _ms(s.itl_ms, "p50"),
            _ms(s.itl_ms, "p99"),
            _ms(s.tpot_ms, "p50"),
            _ms(s.e2e_ms, "p99"),
            "-" if s.goodput is None else f"{s.goodput:.2f}",
            {None: "-", True: "held", False: "missed"}[p.is_slo_held],
        )
    return t


def print_report(result: BenchResult, console: Console) -> None:
    for p in result.points:
        console.print(summary_table(f"{result.model}: {p.result.load.label}", p.summary))
        console.print(latency_table(p.summary))
        if p.bursts is not None:
            title = f"background bursts during {p.result.load.label}"
            console.print(summary_table(title, p.bursts.summary))
            console.print(latency_table(p.bursts.summary))
    if len(result.points) > 1:
        console.print(sweep_table(result))
    if result.config.slo.targets:
        cap = result.capacity
        console.print(
            f"capacity under {result.config.slo.targets} "
            f"(>= {100 * result.config.slo.min_attainment:g}% of requests): "
            + ("none of the points" if cap is None else cap.label)
        )
