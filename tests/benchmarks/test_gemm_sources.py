"""benchmarks/gemm_sources.py runs end to end on the compiled kernels: one line per weight
source, each with a rate and its fraction of the FMA peak."""

from __future__ import annotations

import re

from tests.benchmarks.scripts import run_script
from tests.kernels.cpu_ops import cpu_ops


def test_prints_each_source_against_the_fma_peak() -> None:
    cpu_ops()
    out = run_script("gemm_sources.py", "--rows", "4", "--passes", "1", "--layers", "2")
    assert "8 packed decode GEMMs, M=4" in out
    for source in ("memory", "L3", "L2"):
        line = next(line for line in out.splitlines() if line.strip().startswith(source))
        assert re.search(r"\d+\.\d GFLOP/s\s+\d+\.\d% of the FMA peak", line), line
