"""Measure this machine's fp32 GEMM rate at the benchmark model's matmul shapes, and its
streaming read bandwidth.

    python benchmarks/roofline.py [--m 32 128 512] [--streamed 1 18 32]

Prints (and with ``--out`` writes) GFLOP/s per row count ``M``: ``x[M, K] @ W[N, K].T`` over
one decoder layer's seven projections (rate = their FLOPs over their time, from the fastest
call of each and from the median call), and the lm_head alone; the same layer on pdserve's
packed GEMM too, where the compiled CPU kernels load. The best fastest-call layer rate of
either is the roofline the benchmark compares engines against, and the floor's GEMM rate: what
two cores do with no one else on them (other jobs share this machine, so the median call is
often slower). Until 2026-12-07 it was ``F.linear``'s alone, which on an AVX2-only VM priced
the floor's prefill below the rate pdserve's own prefill GEMMs ran at.

The fp32 FMA peak (``benchmarks/fma_peak.py``: vector FMAs on registers alone) is printed beside
them: the arithmetic units' own limit, which no kernel passes and pdserve's packed GEMM comes
closer to than ``F.linear``.

The read bandwidth (GB/s of the fastest of 5 multi-threaded sums over 512 MB, far past the
caches) is the memory floor: decode steps cannot stream weights or KV faster. ``--streamed``
times all 30 layers' GEMMs with weights from DRAM at decode-like M, with ``F.linear`` and (when
they build) pdserve's packed GEMM of the compiled CPU kernels, against that floor.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.fma_peak import measure_fma_peak
from benchmarks.workloads import model_shape


def _time_linear(
    m: int, k: int, n: int, min_s: float, kernels: Any = None
) -> tuple[float, float, float]:
    """(flops of one call, fastest call's seconds, median call's seconds) of ``F.linear`` at
    [m, k] x [n, k]^T (or, given the compiled CPU ``kernels``, of their packed GEMM on the same
    weight), timed call by call for ``min_s`` after a warm-up. The fastest call is the
    machine's rate when nothing else competes for the cores; the median shows the load."""
    x = torch.randn(m, k, dtype=torch.float32)
    w = torch.randn(n, k, dtype=torch.float32)
    call: Callable[[], torch.Tensor] = functools.partial(F.linear, x, w)
    if kernels is not None:
        call = functools.partial(kernels.linear, x, kernels.pack_linear_weight(w), n, None)
    for _ in range(3):
        call()
    times: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_s or len(times) < 5:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 2.0 * m * k * n, min(times), statistics.median(times)


def _layer_rates(m: int, min_s: float, kernels: Any = None) -> tuple[float, float]:
    """(fastest-call, median-call) GFLOP/s over one decoder layer's projections at M=m: their
    FLOPs over the sum of their per-call times."""
    flops = best_s = median_s = 0.0
    for _, k, n in model_shape().linear_shapes():
        f, fastest, median = _time_linear(m, k, n, min_s, kernels)
        flops += f
        best_s += fastest
        median_s += median
    return flops / best_s / 1e9, flops / median_s / 1e9


def measure_gemm(row_counts: list[int], min_s: float = 0.5) -> dict[str, Any]:
    """GFLOP/s per row count over one decoder layer's projections, fastest-call and
    median-call, for ``F.linear`` and (when the compiled CPU kernels load) pdserve's packed
    GEMM, and the lm_head's fastest-call rate. ``best_layer_gflops``, the roofline's and the
    floor's GEMM rate, is the best fastest-call layer rate of either: the floor must not price
    work slower than an engine on this machine already does it."""
    from kernels.cpu import load

    shape = model_shape()
    kernels = load()
    by_m: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for m in row_counts:
            fastest, median = _layer_rates(m, min_s)
            lm_f, lm_fastest, _ = _time_linear(m, shape.hidden_size, shape.vocab_size, min_s)
            by_m[str(m)] = {
                "layer_gflops": fastest,
                "layer_gflops_median": median,
                "lm_head_gflops": lm_f / lm_fastest / 1e9,
            }
            if kernels is not None:
                packed_fastest, packed_median = _layer_rates(m, min_s, kernels)
                by_m[str(m)]["packed_layer_gflops"] = packed_fastest
                by_m[str(m)]["packed_layer_gflops_median"] = packed_median
    best = max(max(v["layer_gflops"], v.get("packed_layer_gflops", 0.0)) for v in by_m.values())
    return {"num_threads": torch.get_num_threads(), "by_m": by_m, "best_layer_gflops": best}


def measure_read_bandwidth(mbytes: int = 512, passes: int = 5) -> float:
    """GB/s (1e9 B/s) of the fastest of ``passes`` multi-threaded sums over ``mbytes`` MB."""
    buf = torch.ones(mbytes * (1 << 20) // 4, dtype=torch.float32)
    float(buf.sum())  # first touch
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        float(buf.sum())
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best / 1e9


def measure_streamed(row_counts: list[int], passes: int = 5) -> dict[str, Any]:
    """Per-step cost of all decoder layers' GEMMs when weights come from DRAM, as in a real
    forward pass: every layer has its own weights (the whole model's, ~425 MB in fp32), so
    nothing stays in cache between calls. At decode-like ``M`` this is bandwidth-bound; the
    fastest pass gives GB/s of weights streamed and GFLOP/s. Measured for ``F.linear`` and,
    when the compiled CPU kernels load, for their packed GEMM (``pdserve``), with the weights'
    bytes at the read bandwidth measured in the same run as the floor."""
    from kernels.cpu import load

    shape = model_shape()
    layers = [
        [torch.randn(n, k, dtype=torch.float32) for _, k, n in shape.linear_shapes()]
        for _ in range(shape.num_hidden_layers)
    ]
    weight_bytes = sum(w.numel() * 4 for layer in layers for w in layer)
    read_gbps = measure_read_bandwidth()
    impls: dict[str, list[list[Callable[[torch.Tensor], torch.Tensor]]]] = {
        "F.linear": [[functools.partial(_f_linear, w=w) for w in layer] for layer in layers]
    }
    kernels = load()
    if kernels is not None:
        impls["pdserve"] = [
            [
                functools.partial(
                    kernels.linear,
                    packed=kernels.pack_linear_weight(w),
                    out_features=w.shape[0],
                    bias=None,
                )
                for w in layer
            ]
            for layer in layers
        ]
    del layers
    by_impl: dict[str, dict[str, dict[str, float]]] = {}
    with torch.inference_mode():
        for name, fns in impls.items():
            by_m: dict[str, dict[str, float]] = {}
            for m in row_counts:
                xs = {k: torch.randn(m, k) for _, k, _ in shape.linear_shapes()}
                ks = [k for _, k, _ in shape.linear_shapes()]
                times = []
                for _ in range(passes + 1):
                    t0 = time.perf_counter()
                    for layer in fns:
                        for f, k in zip(layer, ks, strict=True):
                            f(xs[k])
                    times.append(time.perf_counter() - t0)
                fastest = min(times[1:])
                flops = 2.0 * m * shape.params_in_linear_layers
                by_m[str(m)] = {
                    "pass_ms": fastest * 1e3,
                    "weight_gb_per_s": weight_bytes / fastest / 1e9,
                    "gflops": flops / fastest / 1e9,
                    "x_floor": fastest / (weight_bytes / (read_gbps * 1e9)),
                }
            by_impl[name] = by_m
    return {
        "weight_bytes": weight_bytes,
        "read_gbps": read_gbps,
        "floor_ms": weight_bytes / (read_gbps * 1e9) * 1e3,
        "by_m": by_impl["F.linear"],
        "by_impl": by_impl,
    }


def _f_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--min-s", type=float, default=0.5, help="seconds timed per shape")
    parser.add_argument("--out", help="write the result as JSON here")
    parser.add_argument(
        "--streamed",
        type=int,
        nargs="*",
        metavar="M",
        help="also time all 30 layers' GEMMs with weights streamed from DRAM at these M "
        "(decode-like rows, e.g. 1 16 32)",
    )
    args = parser.parse_args()
    result = measure_gemm(args.m, args.min_s)
    result["read_gbps"] = measure_read_bandwidth()
    print(f"read bandwidth: {result['read_gbps']:.1f} GB/s (fastest of 5 sums over 512 MB)")
    result["fma_gflops"] = measure_fma_peak(torch.get_num_threads())
    if result["fma_gflops"] is not None:
        print(f"fp32 FMA peak (registers only): {result['fma_gflops']:.1f} GFLOP/s")
    if args.streamed:
        streamed = measure_streamed(args.streamed)
        result["streamed"] = streamed
        print(
            f"streamed floor: {streamed['weight_bytes'] / 1e6:.0f} MB of weights at "
            f"{streamed['read_gbps']:.1f} GB/s = {streamed['floor_ms']:.1f} ms"
        )
        for name, by_m in streamed["by_impl"].items():
            for m, r in by_m.items():
                print(
                    f"streamed {name:<8} M={m:>4}: {r['pass_ms']:.1f} ms for 30 layers' GEMMs "
                    f"({r['x_floor']:.2f}x the floor), {r['weight_gb_per_s']:.1f} GB/s of "
                    f"weights, {r['gflops']:.1f} GFLOP/s"
                )
    for m, rates in result["by_m"].items():
        packed = ""
        if "packed_layer_gflops" in rates:
            packed = (
                f"; packed layer {rates['packed_layer_gflops']:.1f} fastest, "
                f"{rates['packed_layer_gflops_median']:.1f} median"
            )
        print(
            f"M={m:>4}: layer {rates['layer_gflops']:.1f} GFLOP/s fastest call, "
            f"{rates['layer_gflops_median']:.1f} median call; "
            f"lm_head {rates['lm_head_gflops']:.1f} GFLOP/s fastest call{packed}"
        )
    print(f"roofline GEMM rate (best of the above): {result['best_layer_gflops']:.1f} GFLOP/s")
    if args.out:
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
