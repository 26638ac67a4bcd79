"""Prices two changes to the CPU decode attention's arithmetic before they are built.

    python benchmarks/decode_item_model.py [--blocks 21] [--reps 20000] [--rounds 3]

Builds ``benchmarks/decode_item_model.cpp`` with the compiled CPU kernels' compiler, ISA flags
and vector type (``benchmarks/cxx_probe.py``, as for ``fma_peak.cpp``) and runs it on one
thread: one decode work item of SmolLM2-135M's shape (9 rows over 3 KV heads, 64 dims) over
``--blocks`` blocks of 16 keys, small enough to stay in L2, so what it times is the item's
arithmetic, not the memory.
Four variants, the rounds alternating them: the kernel's own way (slot-major K/V, scores with
horizontal sums, P·V through memory), P·V with a head's rows held in registers, K stored
dimension-major within a block (a row's block scores are whole vectors), and both. Prints each
variant's median ns a position and its ratio to the kernel's way, and checks that every
variant's output equals the kernel's way's to 1e-5.

What it leaves out: the kernel's prefetches and its items' setup, and the memory. On a machine
whose memory keeps up (the attention's time in cache close to its time cold:
``decode_kernels.py``), the arithmetic is what a decode step's attention costs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cxx_probe import build_probe

SOURCE = Path(__file__).resolve().with_name("decode_item_model.cpp")
VARIANTS = ("slot-major", "held-pv", "dim-major", "dim-major+held-pv")
TOLERANCE = 1e-5


def measure(blocks: int, reps: int, rounds: int) -> dict[str, float] | None:
    """Median ns a position per variant, or None without a compiler. Raises when a variant's
    output differs from the kernel's way's by more than TOLERANCE."""
    binary = build_probe(SOURCE)
    if binary is None:
        return None
    out = subprocess.run(
        [str(binary), str(blocks), str(reps), str(rounds)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for line in out:
        kind, *rest = line.split()
        if kind == "round":
            times[rest[1]].append(float(rest[2]))
        elif kind == "diff" and float(rest[1]) > TOLERANCE:
            raise AssertionError(f"{rest[0]}'s output differs from slot-major's by {rest[1]}")
    return {v: statistics.median(t) for v, t in times.items()}


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=21, help="blocks of 16 keys (default 21)")
    parser.add_argument("--reps", type=int, default=20000, help="items a round and variant")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    ns = measure(args.blocks, args.reps, args.rounds)
    if ns is None:
        print("no C++ compiler here: the model cannot be built")
        return None
    base = ns[VARIANTS[0]]
    print(f"one decode item, {args.blocks * 16} positions, one thread, medians of {args.rounds}")
    for v in VARIANTS:
        print(f"  {v:<18} {ns[v]:6.2f} ns a position  x{ns[v] / base:.2f}")
    return ns


if __name__ == "__main__":
    main()
