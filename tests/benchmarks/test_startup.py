"""benchmarks/startup.py times `pdserve serve` to its first 200 on /health and stops it."""

from __future__ import annotations

import re

from tests.benchmarks.scripts import run_script


def test_times_a_colocated_server_to_health() -> None:
    out = run_script("startup.py", "--rounds", "1", "--modes", "colocated")
    line = next(x for x in out.splitlines() if x.strip().startswith("colocated"))
    seconds = float(re.search(r"colocated\s+(\d+\.\d+) s", line).group(1))  # type: ignore[union-attr]
    assert 0 < seconds < 300, line
