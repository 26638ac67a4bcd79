"""The simulator's own plots (beside ``pdserve bench``'s): every pool's queue, batch and KV
usage over time, per load point."""

from __future__ import annotations

from pathlib import Path

from pdserve.plan.simulate import SimResult


def write_sim_plots(result: SimResult, out_dir: Path) -> list[Path]:
    """Writes ``pools_over_time.png`` (one row per load point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result.points
    if not points:
        return []
    fig, axes = plt.subplots(len(points), 3, figsize=(14, 3.2 * len(points)), squeeze=False)
    for row, p in zip(axes, points, strict=True):
        s = p.samples
        for role in s.waiting:
            row[0].plot(s.t, s.waiting[role], label=role)
            row[1].plot(s.t, s.running[role], label=role)
            row[2].plot(s.t, [100 * u for u in s.kv_usage[role]], label=role)
        for ax, what in zip(
            row, ("waiting requests", "requests in the batch", "KV usage %"), strict=True
        ):
            ax.set(xlabel="time (s)", ylabel=what, title=f"{p.load.label}: {what}")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    path = out_dir / "pools_over_time.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
