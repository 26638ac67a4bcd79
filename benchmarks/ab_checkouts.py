"""Run the same timing script in several checkouts, taking turns, for an A/B in one invocation.

Each checkout's code (and its compiled kernels, built or taken from the build cache) runs in a
subprocess of its own with the checkout's root first on ``sys.path``; the script prints one line
``RESULT <json object of floats>``. Rounds alternate the order (A B, B A, ...) so the machine's
drift hits every checkout alike; per checkout and key the median of its rounds is returned.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

RESULT = "RESULT "


def run_child(tree: Path, code: str, env: dict[str, str] | None = None) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", code, str(tree)], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child in {tree} failed:\n{done.stderr[-4000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith(RESULT))
    result: dict[str, float] = json.loads(line[len(RESULT) :])
    return result


def alternate_rounds(
    trees: list[Path], code: str, rounds: int
) -> dict[Path, list[dict[str, float]]]:
    """Per tree, what the script reported in each of ``rounds`` runs, the trees taking turns
    (A B, B A, ...)."""
    runs: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(rounds):
        for t in trees if r % 2 == 0 else list(reversed(trees)):
            runs[t].append(run_child(t, code))
    return runs


def alternate(trees: list[Path], code: str, rounds: int) -> dict[Path, dict[str, float]]:
    """Per tree, the median over ``rounds`` runs of each key the script reports."""
    runs = alternate_rounds(trees, code, rounds)
    return {t: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for t, rs in runs.items()}
