"""Measure a CUDA device's GEMM rate at the benchmark model's matmul shapes and its HBM read
bandwidth: the GPU counterpart of ``roofline.py``, for the physical floor of
``offline_throughput.py --gpu-roofline``.

    python benchmarks/gpu_roofline.py [--shape llama-1b] [--dtype bfloat16] [--m 512 2048]

GEMM: ``x[M, K] @ W[N, K].T`` over one decoder layer's projections, each call's median time
from ``triton.testing.do_bench`` (inputs random: zeros run faster than real data); the best
layer rate over ``--m`` is the roofline. Read bandwidth: the median time of sums over a 4 GiB
tensor (far past the 50-60 MB L2), counting the bytes read once. Both are
what this card does now, with no one else on it: datasheet figures are only leads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import SHAPES, model_shape

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _median_ms(fn: Any) -> float:
    """Median milliseconds of ``fn`` by ``triton.testing.do_bench`` (CUDA events, L2 flushed
    between calls), as ``benchmarks/kernels.py`` times the kernels."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def measure_gemm(shape_name: str, dtype: torch.dtype, row_counts: list[int]) -> dict[str, Any]:
    """GFLOP/s per row count over one decoder layer's projections, and the lm_head's."""
    shape = model_shape(shape_name)
    by_m: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for m in row_counts:
            flops = ms = 0.0
            for _, k, n in shape.linear_shapes():
                x = torch.randn(m, k, dtype=dtype, device="cuda")
                w = torch.randn(n, k, dtype=dtype, device="cuda")
                ms += _median_ms(lambda x=x, w=w: F.linear(x, w))
                flops += 2.0 * m * k * n
            x = torch.randn(m, shape.hidden_size, dtype=dtype, device="cuda")
            w = torch.randn(shape.vocab_size, shape.hidden_size, dtype=dtype, device="cuda")
            head_ms = _median_ms(lambda x=x, w=w: F.linear(x, w))
            head_flops = 2.0 * m * shape.hidden_size * shape.vocab_size
            by_m[str(m)] = {
                "layer_gflops": flops / ms / 1e6,
                "lm_head_gflops": head_flops / head_ms / 1e6,
            }
    best = max(v["layer_gflops"] for v in by_m.values())
    return {"by_m": by_m, "best_layer_gflops": best}


def measure_read_bandwidth(gib: int = 4) -> float:
    """GB/s (1e9 B/s): the median of timed sums over ``gib`` GiB of fp32, bytes read once."""
    buf = torch.rand(gib * (1 << 30) // 4, dtype=torch.float32, device="cuda")
    ms = _median_ms(buf.sum)
    return buf.numel() * 4 / (ms / 1e3) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--m", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_roofline: no CUDA device here", file=sys.stderr)
        return 2
    # fp32 GEMMs as the engine runs them: no TF32 (torch's default "highest" precision).
    torch.backends.cuda.matmul.allow_tf32 = False
    result = measure_gemm(args.shape, DTYPES[args.dtype], args.m)
    result["read_gbps"] = measure_read_bandwidth()
    result.update(device=torch.cuda.get_device_name(0), dtype=args.dtype, shape=args.shape)
    print(f"{result['device']}: read bandwidth {result['read_gbps']:.0f} GB/s (sums over 4 GiB)")
    for m, rates in result["by_m"].items():
        print(
            f"{args.dtype} M={m:>5}: layer {rates['layer_gflops'] / 1e3:.1f} TFLOP/s, "
            f"lm_head {rates['lm_head_gflops'] / 1e3:.1f} TFLOP/s (median call)"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
