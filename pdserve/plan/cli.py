"""``pdserve plan``: calibrate a profile, simulate a cluster, search pool sizes.

    pdserve plan profiles                     the shipped profiles
    pdserve plan calibrate engine|refit|metrics ...
    pdserve plan simulate CONFIG [--out DIR]  a simulated ``pdserve bench`` run
    pdserve plan search CONFIG --workers N[,N..] [--helm-values FILE]

Nothing here imports torch (``calibrate engine`` does, lazily, in its own module).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pdserve.plan.calibrate_cli import add_calibrate_parser, run_calibrate

DESCRIPTION = """\
Plan a pdserve cluster: a discrete-event simulator calibrated from measured step times
(profiles), run over pdserve bench's workload/load/SLO config plus a [cluster] table, and a
search over P:D ratios, batch limits and chunk sizes for the best goodput per worker. See
docs/planning.md."""


def add_plan_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="simulate a cluster and size its pools (docs/planning.md)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    psub = p.add_subparsers(dest="plan_command", required=True)
    psub.add_parser("profiles", help="list the shipped profiles")
    add_calibrate_parser(psub)

    s = psub.add_parser("simulate", help="simulate a config as pdserve bench would run it")
    s.add_argument("config", type=Path, help="TOML/JSON: [cluster] [router] ... + bench tables")
    s.add_argument("--profile", default=None, help="overrides [cluster] profile")
    s.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write results.json (pdserve bench's format), pools.json and plots",
    )
    s.add_argument(
        "--all-points", action="store_true", help="keep going after a point misses the SLO"
    )

    q = psub.add_parser("search", help="the best P:D split and engine limits per size")
    q.add_argument("config", type=Path)
    q.add_argument("--workers", required=True, help="total workers, e.g. 2,8,64,512")
    q.add_argument("--profile", default=None)
    q.add_argument("--max-num-seqs", default="", help="decode batch limits to try, e.g. 32,128")
    q.add_argument("--chunk-sizes", default="", help="prefill token budgets to try, e.g. 512,2048")
    q.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        help="per worker (default: the profile's); adds goodput per dollar",
    )
    q.add_argument("--top", type=int, default=3)
    q.add_argument(
        "--helm-values",
        type=Path,
        default=None,
        help="write the best configuration's chart values here",
    )
    q.add_argument("--json", type=Path, default=None, help="every evaluated candidate")


def run_plan(a: argparse.Namespace) -> int:
    if a.plan_command == "profiles":
        from pdserve.plan.profile_format import load_profile, shipped_profiles

        for name in shipped_profiles():
            print(f"{name}: {load_profile(name).description}")
        return 0
    if a.plan_command == "calibrate":
        return run_calibrate(a)
    try:
        if a.plan_command == "simulate":
            return _simulate(a)
        from pdserve.plan.search_cli import run_search

        return run_search(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def load_sim_config(path: Path, profile: str | None) -> Any:
    from dataclasses import replace

    from pdserve.bench.config import load_config
    from pdserve.plan.sim_config import SimConfig

    config = SimConfig.from_dict(load_config(path))
    if profile:
        config = replace(config, cluster=replace(config.cluster, profile=profile))
    return config


def _simulate(a: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from rich.console import Console

    from pdserve.bench.plots import write_plots
    from pdserve.bench.report import print_report, write_json
    from pdserve.plan.plots import write_sim_plots
    from pdserve.plan.simulate import load_profiles, simulate

    config = load_sim_config(a.config, a.profile)
    result = simulate(config, load_profiles(config, a.config.parent), a.all_points)
    console = Console()
    bench = result.bench_result()
    print_report(bench, console)
    for p in result.points:
        pools = ", ".join(
            f"{s.role} x{s.num_workers}: util {100 * s.utilisation:.0f}%, "
            f"{s.num_preemptions} preemptions"
            for s in p.pools
        )
        console.print(
            f"{p.load.label}: {pools}; simulated {p.duration_s:.1f} s "
            f"({p.num_requests} requests, {p.num_events} events) in {p.wall_s:.2f} s"
        )
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        if all(p.records is not None for p in result.points):
            write_json(bench, a.out / "results.json")
            write_plots(bench, a.out)
        pools_json = [
            {
                "load": p.load.label,
                "pools": [asdict(s) for s in p.pools],
                "samples": asdict(p.samples),
                "wall_s": p.wall_s,
            }
            for p in result.points
        ]
        (a.out / "pools.json").write_text(json.dumps(pools_json) + "\n", encoding="utf-8")
        write_sim_plots(result, a.out)
        console.print(f"wrote {a.out}")
    return 0
