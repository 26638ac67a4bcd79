"""Where the decode GEMMs lose against the FMA peak: the same 120 packed GEMMs of a decode step
(the 30 decoder layers' qkv, o, gate_up and down at M rows), with their weights coming from
three places, in alternating passes:

- ``memory``: every layer its own weights (425 MB for the 135M shape: nothing stays cached),
  packed into one buffer on huge pages in the order a step reads them, as in the engine;
- ``L3``: layer 0's four weights (14 MB) for every layer, so they come back from the last-level
  cache;
- ``L2``: one o-sized weight (1.3 MB, half of it per core) for all 120 calls, FLOPs counted as
  such: what the kernel does with its operands in the core's own caches, call overhead
  included.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/gemm_sources.py [--rows 18] [--passes 9]

Each line: fastest and median pass, GFLOP/s of the median and its fraction of the FMA peak
(``benchmarks/fma_peak.py``, measured in the same run). The gap between ``L2`` and ``memory``
is what streaming the weights costs; between the peak and ``L2``, the kernel and its calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.fma_peak import measure_fma_peak
from benchmarks.workloads import model_shape
from engine.packed_weights import empty_packed_weights, pack_into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=18, help="M: decode rows in the step")
    p.add_argument("--passes", type=int, default=9)
    p.add_argument("--layers", type=int, default=None, help="default: the model's")
    args = p.parse_args(argv)
    from kernels.cpu import load

    ops = load()
    if ops is None:
        print("the compiled CPU kernels are not available", file=sys.stderr)
        return 1
    shape = model_shape()
    fused = shape.fused_linear_shapes()
    torch.manual_seed(0)
    weights = shape.random_layer_weights(args.layers)
    per_layer = [(n, k) for k, n in fused]  # [out, in] of qkv, o, gate_up, down
    views = iter(empty_packed_weights(per_layer * len(weights), ops))
    layers = [
        [(pack_into(next(views), w, ops), n, k) for w, (n, k) in zip(ws, per_layer, strict=True)]
        for ws in weights
    ]
    del weights  # the unpacked weights, as the engine releases them
    calls = {
        "memory": [w for layer in layers for w in layer],
        "L3": [w for _ in layers for w in layers[0]],
        "L2": [layers[0][1]] * (4 * len(layers)),
    }
    xs = {k: torch.randn(args.rows, k) for k, _ in fused}

    def flops(ws: list[tuple[torch.Tensor, int, int]]) -> float:
        return sum(2.0 * args.rows * n * k for _, n, k in ws)

    def one_pass(ws: list[tuple[torch.Tensor, int, int]]) -> float:
        t0 = time.perf_counter()
        for w, n, k in ws:
            ops.linear(xs[k], w, n, None)
        return time.perf_counter() - t0

    threads = torch.get_num_threads()
    peak = measure_fma_peak(threads)
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for ws in calls.values():
            one_pass(ws)
        for _ in range(args.passes):
            for name, ws in calls.items():
                times[name].append(one_pass(ws))
    peak_text = f"{peak:.1f} GFLOP/s" if peak is not None else "not measured (no compiler)"
    print(
        f"{4 * len(layers)} packed decode GEMMs, M={args.rows}, threads {threads}; "
        f"FMA peak {peak_text}; ms fastest / median of {args.passes} alternating passes"
    )
    for name, ws in calls.items():
        best, med = min(times[name]), statistics.median(times[name])
        rate = flops(ws) / med / 1e9
        of_peak = f"{rate / peak:5.1%} of the FMA peak" if peak else ""
        print(f"  {name:7} {best * 1e3:7.2f} / {med * 1e3:7.2f}   {rate:6.1f} GFLOP/s  {of_peak}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
