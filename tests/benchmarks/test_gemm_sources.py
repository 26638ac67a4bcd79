"""benchmarks/gemm_sources.py runs end to end on the compiled kernels: one line per weight
source, each with a rate and its fraction of the FMA peak."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.kernels.cpu_ops import cpu_ops

ROOT = Path(__file__).resolve().parents[2]


def test_prints_each_source_against_the_fma_peak() -> None:
    cpu_ops()
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/gemm_sources.py",
            "--rows",
            "4",
            "--passes",
            "1",
            "--layers",
            "2",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "8 packed decode GEMMs, M=4" in out
    for source in ("memory", "L3", "L2"):
        line = next(line for line in out.splitlines() if line.strip().startswith(source))
        assert re.search(r"\d+\.\d GFLOP/s\s+\d+\.\d% of the FMA peak", line), line
