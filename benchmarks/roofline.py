"""Measure this machine's fp32 GEMM rate at the benchmark model's matmul shapes.

    python benchmarks/roofline.py [--m 32 128 512]

Prints (and with ``--out`` writes) GFLOP/s per row count ``M``: ``x[M, K] @ W[N, K].T`` over
one decoder layer's seven projections (rate = their FLOPs over their time), and the lm_head
alone. The best layer rate is the roofline the benchmark compares engines against.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import model_shape


def _time_linear(m: int, k: int, n: int, min_s: float) -> tuple[float, float]:
    """(flops, seconds) of repeated ``F.linear`` at [m, k] x [n, k]^T, after a warm-up."""
    x = torch.randn(m, k, dtype=torch.float32)
    w = torch.randn(n, k, dtype=torch.float32)
    for _ in range(3):
        F.linear(x, w)
    reps, t0 = 0, time.perf_counter()
    while True:
        F.linear(x, w)
        reps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return 2.0 * m * k * n * reps, elapsed


def measure_gemm(row_counts: list[int], min_s: float = 0.3) -> dict[str, Any]:
    shape = model_shape()
    by_m: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for m in row_counts:
            flops = seconds = 0.0
            for _, k, n in shape.linear_shapes():
                f, s = _time_linear(m, k, n, min_s)
                # Weight each projection by its share of a layer's work, not by its repeat count.
                flops += 2.0 * m * k * n
                seconds += s * (2.0 * m * k * n) / f
            lm_f, lm_s = _time_linear(m, shape.hidden_size, shape.vocab_size, min_s)
            by_m[str(m)] = {
                "layer_gflops": flops / seconds / 1e9,
                "lm_head_gflops": lm_f / lm_s / 1e9,
            }
    best = max(v["layer_gflops"] for v in by_m.values())
    return {"num_threads": torch.get_num_threads(), "by_m": by_m, "best_layer_gflops": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--min-s", type=float, default=0.3, help="seconds timed per shape")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args()
    result = measure_gemm(args.m, args.min_s)
    for m, rates in result["by_m"].items():
        print(
            f"M={m:>4}: layer {rates['layer_gflops']:.1f} GFLOP/s, "
            f"lm_head {rates['lm_head_gflops']:.1f} GFLOP/s"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
