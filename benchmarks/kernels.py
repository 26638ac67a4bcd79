"""Time the Triton kernels against torch baselines on a GPU; print markdown tables.

    python benchmarks/kernels.py [--peak-gbps 4800] [--dtype bfloat16] [--budget-s 270]

Sections (model shape from flags; defaults are Llama-3-8B's attention: 32 query heads, 8 KV
heads, head_dim 128, block size 16, bf16):

- decode sweep: GB/s of the decode kernel over tile sizes x warps at two points, to check the
  defaults (64 tokens per tile, 4 warps).
- decode: ``paged_decode_attention`` (split-KV by the engine's heuristic, and unsplit) vs
  gather + SDPA (the paged cache gathered into a dense tensor, then
  ``scaled_dot_product_attention``) and SDPA on an already dense cache (no paging: a floor a
  paged kernel can only match), for contexts 512-32k and batches 1-256. GB/s counts the K/V
  bytes the step must read; "% peak" is that over ``--peak-gbps`` (default: H200, 4.8 TB/s).
- prefill: ``paged_prefill_attention`` on chunks over existing context vs gather + SDPA with
  the causal mask; TFLOP/s from the visible (causal) query-key pairs. Plus a mixed step (one
  prefill chunk and many decodes) as one unified launch vs a prefill launch plus a decode launch.
- kv store / block copy: ``store_kv`` vs an index_put, ``copy_blocks`` vs index_select +
  index_copy; GB/s counts bytes read plus bytes written.

Timings are the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed between calls).
Configs are skipped once ``--budget-s`` of wall time is spent, so the run stays under 5 minutes.
Refuses to run without a CUDA device (``--smoke-on-cpu`` runs tiny shapes in Triton's
interpreter to check the script itself; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and would shadow `kernels/`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.kernel_bench.common import DTYPES, Bench, Shape
from benchmarks.kernel_bench.decode import bench_decode, bench_decode_sweep
from benchmarks.kernel_bench.prefill import bench_mixed, bench_prefill
from benchmarks.kernel_bench.store import bench_store_and_copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--peak-gbps",
        type=float,
        default=4800.0,
        help="peak HBM bandwidth in GB/s (default: H200, 4800)",
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--num-layers", type=int, default=32, help="layers per block in the block-copy section"
    )
    parser.add_argument(
        "--max-decode-tokens",
        type=int,
        default=2**23,
        help="skip decode configs with batch x context above this",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=270.0,
        help="stop starting new configs after this many seconds",
    )
    parser.add_argument(
        "--sections",
        default="decode,sweep,prefill,mixed,store",
        help="comma-separated subset of decode,sweep,prefill,mixed,store",
    )
    parser.add_argument(
        "--smoke-on-cpu",
        action="store_true",
        help="tiny shapes in Triton's interpreter on CPU: checks the script only",
    )
    args = parser.parse_args(argv)

    if args.smoke_on_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported
        device = torch.device("cpu")
        contexts, batches = [64, 128], [1, 2]
        prefill = [(1, 0, 32), (2, 32, 16)]
        mixed = (16, 48, 3)
        sweep = [(2, 128)]
        tokens, pairs, layers = [4, 16], [2], 2
        shape = Shape(4, 2, 32, args.block_size, DTYPES["float32"])
    else:
        if not torch.cuda.is_available():
            print(
                "benchmarks/kernels.py needs a CUDA GPU; none is visible here (torch "
                f"{torch.__version__}). Nothing was measured. (--smoke-on-cpu checks the "
                "script itself in Triton's interpreter; its numbers mean nothing.)",
                file=sys.stderr,
            )
            return 2
        device = torch.device("cuda")
        contexts = [512, 1024, 2048, 4096, 8192, 16384, 32768]
        batches = [1, 16, 64, 256]
        prefill = [
            (1, 0, 512),
            (1, 0, 2048),
            (1, 0, 8192),
            (1, 4096, 512),
            (1, 16384, 2048),
            (4, 2048, 1024),
            (16, 0, 512),
        ]
        mixed = (2048, 4096, 255)
        sweep = [(16, 8192), (256, 4096)]
        tokens, pairs, layers = [1, 256, 4096, 16384], [1, 64, 512], args.num_layers
        shape = Shape(
            args.num_heads, args.num_kv_heads, args.head_dim, args.block_size, DTYPES[args.dtype]
        )

    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"
    print(f"## Triton kernels on {name}\n")
    print(
        f"torch {torch.__version__}, triton {triton.__version__}; heads {shape.num_heads}, "
        f"KV heads {shape.num_kv_heads}, head_dim {shape.head_dim}, block size "
        f"{shape.block_size}, {str(shape.dtype).removeprefix('torch.')}; peak "
        f"{args.peak_gbps:.0f} GB/s; times are medians in microseconds"
    )
    bench = Bench(device, args.budget_s, args.peak_gbps)
    start = time.monotonic()
    sections = set(args.sections.split(","))
    torch.manual_seed(0)
    with torch.inference_mode():
        if "decode" in sections:
            bench_decode(bench, shape, contexts, batches, args.max_decode_tokens)
        if "sweep" in sections:
            bench_decode_sweep(bench, shape, sweep, [32, 64, 128], [4, 8])
        if "prefill" in sections:
            bench_prefill(bench, shape, prefill)
        if "mixed" in sections:
            bench_mixed(bench, shape, *mixed)
        if "store" in sections:
            bench_store_and_copy(bench, shape, tokens, pairs, layers)
    print(
        f"\n{time.monotonic() - start:.0f} s total"
        + (f"; {bench.skipped} configs skipped (over --budget-s)" if bench.skipped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
