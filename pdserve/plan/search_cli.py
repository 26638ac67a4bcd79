"""``pdserve plan search``: the planner's tables, the colocated baseline, the Helm values."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from pdserve.plan.helm_values import helm_values, to_yaml
from pdserve.plan.planner import (
    Evaluation,
    SearchSettings,
    default_limits,
    per_dollar,
    search_size,
    verify,
)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _row(e: Evaluation, price: float) -> list[str]:
    s = e.point.summary if e.point is not None else None
    dollars = per_dollar(e, price)
    return [
        e.candidate.label,
        f"{e.total_rate:.3f}",
        f"{e.per_worker:.4f}",
        "-" if dollars is None else f"{dollars:.0f}",
        "-" if s is None or s.ttft_ms is None else f"{s.ttft_ms.p99:.0f}",
        "-" if s is None or s.tpot_ms is None else f"{s.tpot_ms.p99:.1f}",
        "-" if e.verified is None else f"{100 * e.verified:.1f}%",
    ]


def _log(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


def run_search(a: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pdserve.plan.cli import load_sim_config
    from pdserve.plan.simulate import load_profiles

    base = load_sim_config(a.config, a.profile)
    if not base.bench.slo.slo().is_set:
        raise ValueError("search needs [slo] targets (goodput is requests that meet them)")
    profiles = load_profiles(base, a.config.parent)
    seqs, chunks = default_limits(base)
    seqs = _ints(a.max_num_seqs) or seqs
    chunks = _ints(a.chunk_sizes) or chunks
    price = a.price_per_hour
    if price is None:
        price = profiles[base.cluster.profile].device.price_per_hour
    settings = SearchSettings()
    console = Console()
    everything: list[dict[str, Any]] = []
    best_overall: Evaluation | None = None
    for n in _ints(a.workers):
        if n < 2:
            raise ValueError("--workers: a disaggregated cluster needs at least 2")
        _log(f"{n} workers:")
        disagg, coloc = search_size(base, profiles, n, seqs, chunks, settings, _log)
        if disagg and n > settings.unit_max:
            verify(base, profiles, disagg[0], settings)
        if coloc and n > settings.unit_max:
            verify(base, profiles, coloc[0], settings)
        t = Table(
            title=f"{n} workers, SLO {base.bench.slo.targets} "
            f"(>= {100 * base.bench.slo.min_attainment:g}%)"
        )
        for col in (
            "configuration",
            "goodput req/s",
            "per worker",
            "req per $",
            "TTFT p99 ms",
            "TPOT p99 ms",
            "full-size check",
        ):
            t.add_column(col)
        for e in disagg[: a.top]:
            t.add_row(*_row(e, price))
        if coloc:
            t.add_row(*_row(coloc[0], price), style="dim")
        console.print(t)
        if disagg and coloc and coloc[0].per_worker > 0:
            console.print(
                f"best disaggregated / colocated goodput per worker: "
                f"{disagg[0].per_worker / coloc[0].per_worker:.2f}x"
            )
        for e in disagg + coloc:
            everything.append(
                {
                    "workers": n,
                    **asdict(e.candidate),
                    "rate": e.total_rate,
                    "per_worker": e.per_worker,
                    "verified": e.verified,
                }
            )
        if disagg:
            best_overall = disagg[0]
    if a.json:
        a.json.write_text(json.dumps(everything, indent=1) + "\n", encoding="utf-8")
    if a.helm_values and best_overall is not None:
        header = (
            f"pdserve plan search {a.config} --workers {a.workers}\n"
            f"best: {best_overall.candidate.label} at {best_overall.total_rate:.3f} req/s "
            f"under {base.bench.slo.targets}\n"
            "controlPlane.mode redis is needed for pools of more than one pod (PENDING, "
            "issue 14)"
        )
        a.helm_values.write_text(to_yaml(helm_values(best_overall), header), encoding="utf-8")
        console.print(f"wrote {a.helm_values}")
    return 0
