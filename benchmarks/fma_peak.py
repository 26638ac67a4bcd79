"""This machine's fp32 FMA peak: what the cores' FMA units do on registers alone.

    python benchmarks/fma_peak.py [--threads N] [--seconds S]

Builds ``benchmarks/fma_peak.cpp`` with the compiled CPU kernels' compiler, ISA flags and
vector type (``kernels/cpu/vec.h``), caches the binary beside the kernels' builds, and runs it
on N threads (default: torch's intra-op count, the kernels' own). No loads or stores, so no
kernel can beat it: a GEMM's GFLOP/s over this rate is how much of the arithmetic units it
keeps busy, and FLOPs over this rate are the least time any fp32 kernel could take. The
benchmarks' own "GEMM peak" (``roofline.py``) is what ``F.linear`` reaches instead, a rate the
packed kernels can exceed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.cxx_probe import build_probe

SOURCE = Path(__file__).resolve().with_name("fma_peak.cpp")


def build() -> Path | None:
    """This probe's binary (``cxx_probe.build_probe``), or None without a compiler."""
    return build_probe(SOURCE)


def measure_fma_peak(threads: int, seconds: float = 1.0) -> float | None:
    """GFLOP/s (1e9 fp32 FLOP/s, an FMA counting 2) of the best pass on ``threads`` threads,
    or None where the probe cannot be built."""
    binary = build()
    if binary is None:
        return None
    out = subprocess.run(
        [str(binary), str(threads), str(seconds)], check=True, capture_output=True, text=True
    ).stdout
    return float(out.split()[0])


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    for threads in sorted({1, args.threads}):
        peak = measure_fma_peak(threads, args.seconds)
        if peak is None:
            print("no C++ compiler here: the FMA probe cannot be built")
            return
        print(f"fp32 FMA peak, {threads} thread(s): {peak:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
