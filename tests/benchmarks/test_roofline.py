"""benchmarks/roofline.py's GEMM rate: the floor and the roofline price GEMMs at the best of
``F.linear`` and pdserve's packed GEMM, so neither is laxer than an engine on the machine."""

from __future__ import annotations

import pytest

from benchmarks.roofline import measure_gemm
from tests.kernels.cpu_ops import cpu_ops


def test_the_roofline_rate_is_the_best_of_both_gemms() -> None:
    cpu_ops()
    result = measure_gemm([3, 5], min_s=0.01)
    rates = result["by_m"]
    assert set(rates) == {"3", "5"}
    for r in rates.values():
        for key in ("layer_gflops", "layer_gflops_median", "packed_layer_gflops"):
            assert r[key] > 0, key
        assert r["packed_layer_gflops_median"] <= r["packed_layer_gflops"]
    best = max(max(r["layer_gflops"], r["packed_layer_gflops"]) for r in rates.values())
    assert result["best_layer_gflops"] == pytest.approx(best)
