"""benchmarks/fma_peak.py: the probe builds with the CPU kernels' flags and reports a rate."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.fma_peak import build, measure_fma_peak
from tests.benchmarks.scripts import run_script

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler"
)


def test_probe_builds_once_and_reports_gflops() -> None:
    first = build()
    assert first is not None and first.is_file()
    assert build() == first  # cached: the same binary, not rebuilt
    rate = measure_fma_peak(1, seconds=0.05)
    assert rate is not None and rate > 0


def test_command_line_prints_one_line_per_thread_count() -> None:
    out = run_script("fma_peak.py", "--threads", "2", "--seconds", "0.05").splitlines()
    assert [line.split(":")[0] for line in out] == [
        "fp32 FMA peak, 1 thread(s)",
        "fp32 FMA peak, 2 thread(s)",
    ]
    assert all(float(line.split()[-2]) > 0 for line in out)
