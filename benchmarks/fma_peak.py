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
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SOURCE = Path(__file__).resolve().with_name("fma_peak.cpp")


def build(source: Path = SOURCE) -> Path | None:
    """The binary of a benchmark's C++ ``source`` (this probe's by default; it includes
    ``kernels/cpu/vec.h``), built once per source, flags and compiler into the kernels' cache,
    or None without a compiler."""
    from kernels.cpu import BASE_FLAGS, ISA_FLAGS, SOURCE_DIR, cache_root, detect_isa

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return None
    flags = [*BASE_FLAGS, *ISA_FLAGS[detect_isa()], f"-I{SOURCE_DIR}"]
    h = hashlib.sha256(source.read_bytes())
    h.update((SOURCE_DIR / "vec.h").read_bytes())
    h.update(" ".join([cxx, *flags]).encode())
    binary = cache_root() / "probes" / f"{source.stem}-{h.hexdigest()[:16]}"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        subprocess.run([cxx, *flags, str(source), "-o", str(tmp)], check=True)
        tmp.replace(binary)
    return binary


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
