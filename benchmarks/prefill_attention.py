"""Prefill attention of the compiled CPU kernels: this checkout against other checkouts, A/B.

    python benchmarks/prefill_attention.py [--against /path/to/other/worktree ...] [--rounds 2]

One request's chunk (SmolLM2-135M's heads: 9 query heads, 3 KV heads, head size 64; block size
16; blocks shuffled in a block-major pool) through ``paged_attention``: 2,048 new tokens from
position 0, 2,048 after a 2,048-token context, and 512 from 0. Each checkout's kernels are
built (or taken from the build cache) and timed in a subprocess of their own; the checkouts
take turns, ``--rounds`` times, so the machine's drift hits all of them. Prints, per case and
checkout, the median of its rounds' medians (7 calls each) and GFLOP/s of causal attention
(4 x heads x head size per query-key pair), and the ratio to this checkout.

``--against`` is another working tree, e.g. ``git worktree add /tmp/base <commit>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ab_checkouts import alternate

CASES = ((2048, 0), (2048, 2048), (512, 0))
HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16

# Runs in the subprocess, with the checkout's root first on sys.path.
CHILD = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from kernels.cpu import load
ops = load()
assert ops is not None, "compiled CPU kernels unavailable"
heads, kv_heads, dim, bs = {heads}, {kv_heads}, {dim}, {block}
torch.manual_seed(0)
out = {{}}
with torch.inference_mode():
    for q_len, ctx in {cases}:
        n = -(-(q_len + ctx) // bs)
        pool = torch.randn(n + 4, 3, 2, bs, kv_heads, dim)
        table = torch.randperm(n + 4)[:n].to(torch.int32).view(1, -1)
        qsl = torch.tensor([0, q_len], dtype=torch.int32)
        lens = torch.tensor([q_len + ctx], dtype=torch.int32)
        q = torch.randn(q_len, heads, dim)
        o = torch.empty_like(q)
        def call():
            ops.paged_attention(o, q, pool[:, 1, 0], pool[:, 1, 1], table, qsl, lens,
                                dim ** -0.5, 0)
        call()
        times = []
        for _ in range(7):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        out[f"{{q_len}}@{{ctx}}"] = statistics.median(times)
print("RESULT " + json.dumps(out))
"""


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    trees = [here, *[p.resolve() for p in args.against]]
    code = CHILD.format(heads=HEADS, kv_heads=KV_HEADS, dim=DIM, block=BLOCK, cases=CASES)
    medians = {str(t): m for t, m in alternate(trees, code, args.rounds).items()}
    for q_len, ctx in CASES:
        key = f"{q_len}@{ctx}"
        flops = 4 * HEADS * DIM * sum(ctx + i + 1 for i in range(q_len))
        base = medians[str(here)][key]
        for t in trees:
            s = medians[str(t)][key]
            print(
                f"{q_len:5d} new tokens after {ctx:5d}: {s * 1e3:7.1f} ms "
                f"{flops / s / 1e9:6.1f} GFLOP/s  x{s / base:.2f} of this checkout  {t}"
            )
    return medians


if __name__ == "__main__":
    main()
