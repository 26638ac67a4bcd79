"""What the engine's decode GEMMs lose between calls: the 30 decoder layers' packed GEMMs at
decode size (M rows, own weights per layer, 425 MB, so nothing stays cached), timed with
nothing between the calls and with what a forward pass puts between them.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/gemm_gaps.py [--rows 18] [--passes 9]

Gaps (the time in the gap itself is not counted):

- ``none``: back to back;
- ``python``: 60 us of Python busy-waiting on the calling thread (the other OpenMP thread idles);
- ``sleep 0.5 ms`` / ``sleep 2 ms``: both threads idle;
- ``read 20 MB``: a two-thread ``sum`` over 20 MB (another op streaming memory, as attention
  does between a layer's GEMMs).

Prints the fastest and median pass of each, and each one's ratio to ``none``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import model_shape


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=18, help="M: decode rows in the step")
    p.add_argument("--passes", type=int, default=9)
    args = p.parse_args(argv)
    from kernels.cpu import load

    ops = load()
    if ops is None:
        print("the compiled CPU kernels are not available", file=sys.stderr)
        return 1
    shape = model_shape()
    fused = shape.fused_linear_shapes()
    torch.manual_seed(0)
    layers = [
        [(ops.pack_linear_weight(w), w.shape[0], w.shape[1]) for w in layer]
        for layer in shape.random_layer_weights()
    ]
    xs = {k: torch.randn(args.rows, k) for k, _ in fused}
    junk = torch.randn(5 * 1024 * 1024)

    def busy(seconds: float) -> Callable[[], None]:
        def gap() -> None:
            t = time.perf_counter()
            while time.perf_counter() - t < seconds:
                pass

        return gap

    gaps: dict[str, Callable[[], object] | None] = {
        "none": None,
        "python 60 us": busy(60e-6),
        "sleep 0.5 ms": lambda: time.sleep(0.5e-3),
        "sleep 2 ms": lambda: time.sleep(2e-3),
        "read 20 MB": lambda: float(junk.sum()),
    }

    def one_pass(gap: Callable[[], object] | None) -> float:
        t0, in_gaps = time.perf_counter(), 0.0
        for layer in layers:
            for w, n, k in layer:
                ops.linear(xs[k], w, n, None)
                if gap is not None:
                    g0 = time.perf_counter()
                    gap()
                    in_gaps += time.perf_counter() - g0
        return time.perf_counter() - t0 - in_gaps

    print(
        f"30 layers' packed GEMMs, M={args.rows}, threads {torch.get_num_threads()}; "
        f"ms (gaps not counted), fastest / median of {args.passes}"
    )
    base = None
    with torch.inference_mode():
        one_pass(None)
        for name, gap in gaps.items():
            times = [one_pass(gap) for _ in range(args.passes)]
            best, med = min(times) * 1e3, statistics.median(times) * 1e3
            base = base or best
            print(f"  {name:14} {best:7.1f} / {med:7.1f}   {best / base:.2f}x none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
