"""Side by side: several runs' ``results.json`` in one table and one set of CDFs (the same
workload against two servers, or one server with and without a feature)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table

Run = tuple[str, dict[str, Any]]  # (label, a results.json)


def load_runs(paths: list[Path]) -> list[Run]:
    """Each path is a ``results.json`` or a folder holding one; labelled by its folder's name."""
    runs = []
    for p in paths:
        f = p / "results.json" if p.is_dir() else p
        runs.append((f.parent.name, json.loads(f.read_text(encoding="utf-8"))))
    return runs


def _stat(summary: dict[str, Any], name: str, q: str) -> str:
    s = summary.get(name)
    return "-" if not s else f"{s[q]:.1f}"


def _load_label(load: dict[str, Any]) -> str:
    v = load["value"]
    if load["kind"] == "closed":
        return f"concurrency {v}"
    return "rate inf" if v == "inf" else f"rate {v:g}/s"


def compare_table(runs: list[Run]) -> Table:
    """One row per run and load point; latencies in ms."""
    t = Table(title="comparison", title_justify="left")
    for col in (
        "run", "load", "ok/fail", "req/s", "out tok/s", "cached tok",
        "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT p50", "E2E p50", "goodput",
    ):  # fmt: skip
        t.add_column(col, justify="left" if col in ("run", "load") else "right")
    for label, report in runs:
        for point in report["points"]:
            s = point["summary"]
            t.add_row(
                label,
                _load_label(point["load"]),
                f"{s['num_completed']}/{s['num_failed']}",
                f"{s['request_throughput']:.2f}",
                f"{s['output_token_throughput']:.1f}",
                "-" if s["total_cached_tokens"] is None else str(s["total_cached_tokens"]),
                _stat(s, "ttft_ms", "p50"),
                _stat(s, "ttft_ms", "p99"),
                _stat(s, "itl_ms", "p50"),
                _stat(s, "itl_ms", "p99"),
                _stat(s, "tpot_ms", "p50"),
                _stat(s, "e2e_ms", "p50"),
                "-" if s["goodput"] is None else f"{s['goodput']:.2f}",
            )
    return t


def write_compare_plot(runs: list[Run], path: Path) -> Path:
    """TTFT, ITL and end-to-end CDFs, one line per run and load point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, report in runs:
        for point in report["points"]:
            ok = [r for r in point["records"] if r["status"] == "ok"]
            series = (
                [r["ttft_s"] for r in ok if r["ttft_s"] is not None],
                [g for r in ok for g in r["itl_s"]],
                [r["e2e_s"] for r in ok if r["e2e_s"] is not None],
            )
            name = label if len(report["points"]) == 1 else f"{label}, {_load_label(point['load'])}"
            for ax, values in zip(axes, series, strict=True):
                ms = sorted(v * 1000 for v in values if not math.isnan(v))
                if ms:
                    ys = [(i + 1) / len(ms) for i in range(len(ms))]
                    ax.plot(ms, ys, drawstyle="steps-post", label=name)
    for ax, name in zip(axes, ("TTFT", "ITL", "end-to-end"), strict=True):
        lo, hi = ax.dataLim.intervalx
        if lo > 0 and hi / lo > 20:  # runs an order of magnitude apart: a log axis shows both
            ax.set_xscale("log")
        ax.set(xlabel=f"{name} (ms)", ylabel="fraction", title=f"{name} CDF")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
