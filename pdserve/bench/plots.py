"""PNG plots of a run: latency vs load, throughput vs load, and latency CDFs."""

from __future__ import annotations

import math
from pathlib import Path

from pdserve.bench.load import CLOSED
from pdserve.bench.runner import BenchResult, PointReport


def _x(p: PointReport) -> float:
    v = p.result.load.value
    return p.summary.request_throughput if math.isinf(v) else v  # rate inf: plot what it got


def write_plots(result: BenchResult, out_dir: Path) -> list[Path]:
    """Writes ``latency_vs_load.png``, ``throughput_vs_load.png`` and ``latency_cdf.png``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    points = result.points
    if not points:
        return []
    xs = [_x(p) for p in points]
    kind = points[0].result.load.kind
    xlabel = "concurrency (requests in flight)" if kind == CLOSED else "offered rate (requests/s)"
    title = f"{result.model} — {result.config.target.url}"
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (name, attr) in zip(axes, (("TTFT", "ttft_ms"), ("ITL", "itl_ms")), strict=True):
        for q in ("p50", "p95", "p99"):
            ys = [getattr(s, q) if (s := getattr(p.summary, attr)) else math.nan for p in points]
            ax.plot(xs, ys, marker="o", label=q)
        slo = getattr(result.config.slo.slo(), f"{attr[:-3]}_s")
        if slo is not None:
            ax.axhline(slo * 1000, color="red", linestyle="--", label="SLO")
        ax.set(xlabel=xlabel, ylabel=f"{name} (ms)", title=name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    paths.append(out_dir / "latency_vs_load.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(xs, [p.summary.output_token_throughput for p in points], marker="o", label="output")
    ax1.plot(xs, [p.summary.input_token_throughput for p in points], marker="o", label="input")
    ax1.set(xlabel=xlabel, ylabel="tokens/s", title="token throughput")
    ax2.plot(xs, [p.summary.request_throughput for p in points], marker="o", label="completed")
    if points[0].summary.goodput is not None:
        ax2.plot(xs, [p.summary.goodput or 0.0 for p in points], marker="o", label="goodput")
    ax2.set(xlabel=xlabel, ylabel="requests/s", title="request throughput")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    paths.append(out_dir / "throughput_vs_load.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for p in points:
        ok = [r for r in p.result.records if r.status == "ok"]
        series = (
            [r.ttft_s for r in ok if r.ttft_s is not None],
            [g for r in ok for g in r.itl_s],
            [r.e2e_s for r in ok if r.e2e_s is not None],
        )
        for ax, values in zip(axes, series, strict=True):
            if values:
                ms = sorted(v * 1000 for v in values)
                ys = [(i + 1) / len(ms) for i in range(len(ms))]
                ax.plot(ms, ys, drawstyle="steps-post", label=p.result.load.label)
    for ax, name in zip(axes, ("TTFT", "ITL", "end-to-end"), strict=True):
        ax.set(xlabel=f"{name} (ms)", ylabel="fraction", title=f"{name} CDF")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    paths.append(out_dir / "latency_cdf.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
