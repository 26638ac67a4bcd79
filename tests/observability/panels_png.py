"""Render key dashboard panels to one PNG from a Prometheus' data (matplotlib, optional).

The live test calls ``render`` when ``PDSERVE_PANELS_PNG`` names an output file:

    PDSERVE_PANELS_PNG=/tmp/panels.png python -m pytest tests/observability/test_prometheus.py

Each panel is drawn from the dashboard JSON's own queries (``query_range``), so the picture
shows exactly what Grafana would.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.observability.assets import DASHBOARDS, load_dashboard, substitute

KEY_PANELS = (
    ("slo-overview.json", "Time to first token"),
    ("slo-overview.json", "Inter-token latency"),
    ("slo-overview.json", "TTFT breakdown (mean per stage)"),
    ("slo-overview.json", "Requests per second by outcome"),
    ("capacity.json", "Batch size (tokens per step)"),
    ("transfer.json", "KV transfer bandwidth"),
)


def _legend(fmt: str, labels: dict[str, str]) -> str:
    for k, v in labels.items():
        fmt = fmt.replace("{{" + k + "}}", v)
    return fmt


def render(prom_url: str, out: Path, start: float, end: float, variables: dict[str, str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8), constrained_layout=True)
    for ax, (file, title) in zip(axes.flat, KEY_PANELS, strict=True):
        panel = next(p for p in load_dashboard(DASHBOARDS / file)["panels"] if p["title"] == title)
        for target in panel["targets"]:
            r = httpx.get(
                f"{prom_url}/api/v1/query_range",
                params={
                    "query": substitute(target["expr"], variables),
                    "start": start,
                    "end": end,
                    "step": 1,
                },
                timeout=10,
            ).json()
            for series in r["data"]["result"]:
                xs = [float(t) - start for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, label=_legend(target["legendFormat"], series["metric"]))
        ax.set_title(f"{title} ({panel['fieldConfig']['defaults']['unit']})", fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("pdserve dashboards, rendered from a test run's Prometheus data")
    fig.savefig(out, dpi=80)
    plt.close(fig)
