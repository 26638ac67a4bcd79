"""The qualitative findings of docs/planning.md, reproduced by simulation (each figure one
function; ``python -m pdserve.plan.findings --out DIR [--profile NAME]`` makes them all):

    bursts.png    colocated ITL degrades under prefill bursts; disaggregated decode does not
    slo.png       disaggregation wins goodput per worker at tight TPOT SLOs, loses at loose
    ratio.png     the best P:D split moves with the prompt/output length ratio
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pdserve.plan.planner import SearchSettings, search_size
from pdserve.plan.profile_format import Profile, load_profile
from pdserve.plan.sim_config import SimConfig
from pdserve.plan.simulate import simulate_point

TRANSPORT = ["tcp"]  # main sets it: the profile's fastest KV transport
SETTINGS = SearchSettings(
    requests_per_worker=40, min_requests=160, bisect_steps=5, min_duration_s=60.0
)


def _config(profile: str, **tables: dict[str, Any]) -> SimConfig:
    d: dict[str, Any] = {
        "cluster": {"profile": profile, "transport": TRANSPORT[0]},
        "workload": {
            "num_requests": 200,
            "prompt_len": "uniform:256:1024",
            "output_len": "uniform:64:256",
        },
        "load": {"kind": "open", "rates": [1.0]},
        "sim": {"records": "compact"},
    }
    for k, v in tables.items():
        d.setdefault(k, {}).update(v)
    return SimConfig.from_dict(d)


def bursts(profiles: dict[str, Profile], name: str, out: Path) -> Path:
    """ITL p99 of a steady decode load while bursts of long prompts arrive."""
    import matplotlib.pyplot as plt

    sizes = [0, 1, 2, 4, 8]
    lines: dict[str, list[float]] = {"colocated (2 workers)": [], "1P1D": []}
    for size in sizes:
        for label in lines:
            cluster = (
                {"mode": "colocated", "num_colocated": 2}
                if "colocated" in label
                else {"num_prefill": 1, "num_decode": 1}
            )
            c = _config(
                name,
                cluster=cluster,
                workload={
                    "num_requests": 300,
                    "prompt_len": "uniform:64:256",
                    "output_len": "uniform:128:256",
                },
                load={"kind": "closed", "concurrency": [16], "rates": [1.0]},
                bursts={
                    "size": size,
                    "interval_s": 2.0,
                    "start_s": 0.5,
                    "prompt_len": "fixed:4096",
                    "output_len": "fixed:1",
                },
            )
            p = simulate_point(c, profiles, c.bench.load.points()[0])
            assert p.summary.itl_ms is not None
            lines[label].append(p.summary.itl_ms.p99)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, ys in lines.items():
        ax.plot(sizes, ys, marker="o", label=label)
    ax.set(
        xlabel="4096-token prompts per burst (every 2 s)",
        ylabel="ITL p99 (ms)",
        title=f"decode ITL under prefill bursts ({name})",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out / "bursts.png")


def slo(profiles: dict[str, Profile], name: str, out: Path, workers: int = 4) -> Path:
    """Best goodput per worker, disaggregated and colocated, as the TPOT SLO loosens."""
    import matplotlib.pyplot as plt

    base_tpot = profiles[name].step.decode_seconds(1, 512) * 1000
    tpots = [round(base_tpot * f, 1) for f in (1.5, 2.5, 4, 8, 16)]
    dis, col = [], []
    for t in tpots:
        c = _config(
            name,
            slo={"targets": f"ttft=2000ms,tpot={t}ms", "min_attainment": 0.9},
            colocated={"max_num_batched_tokens": 512},
        )
        d, k = search_size(c, profiles, workers, [128], [2048], SETTINGS)
        dis.append(d[0].per_worker)
        col.append(k[0].per_worker)
        print(
            f"tpot {t} ms: {d[0].candidate.label} {d[0].per_worker:.3f}, colocated "
            f"{k[0].per_worker:.3f} req/s per worker",
            file=sys.stderr,
        )
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(tpots, dis, marker="o", label="best P:D split")
    ax.plot(tpots, col, marker="o", label="colocated (chunk 512)")
    ax.set(
        xscale="log",
        xlabel="TPOT SLO (ms)",
        ylabel="goodput per worker (req/s)",
        title=f"{workers} workers, TTFT SLO 2 s ({name})",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out / "slo.png")


def ratio(profiles: dict[str, Profile], name: str, out: Path, workers: int = 8) -> Path:
    """The best number of prefill workers of ``workers`` per prompt:output shape."""
    import matplotlib.pyplot as plt

    shapes = [(2048, 32), (1024, 128), (512, 256), (256, 512), (128, 1024)]
    best = []
    for prompt, output in shapes:
        c = _config(
            name,
            workload={
                "prompt_len": f"uniform:{prompt // 2}:{prompt * 3 // 2}",
                "output_len": f"uniform:{output // 2}:{output * 3 // 2}",
            },
            slo={"targets": "ttft=3000ms,tpot=100ms", "min_attainment": 0.9},
        )
        d, _ = search_size(c, profiles, workers, [128], [2048], SETTINGS)
        best.append(d[0].candidate.num_prefill)
        print(f"{prompt}:{output}: {d[0].candidate.label}", file=sys.stderr)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p / o for p, o in shapes], best, marker="o")
    ax.set(
        xscale="log",
        xlabel="mean prompt / mean output tokens",
        ylabel=f"prefill workers in the best split of {workers}",
        title=f"best P:D vs prompt/output ratio ({name})",
    )
    ax.grid(alpha=0.3)
    return _save(fig, out / "ratio.png")


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", default="h100-llama2-7b-published")
    ap.add_argument("--only", default="bursts,slo,ratio")
    ap.add_argument("--transport", default=None, help="default: the profile's fastest")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    profiles = {a.profile: load_profile(a.profile)}
    links = profiles[a.profile].transfer
    TRANSPORT[0] = a.transport or max(links, key=lambda k: links[k].bytes_per_s)
    print(f"KV transport: {TRANSPORT[0]}", file=sys.stderr)
    for fig in a.only.split(","):
        path = {"bursts": bursts, "slo": slo, "ratio": ratio}[fig](profiles, a.profile, a.out)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["bursts", "main", "ratio", "slo"]
