"""Swapping KV blocks on the CPU: ``KVCache.swap_out`` / ``swap_in`` against a staged copy.

    python benchmarks/swap_copy.py [--blocks 64] [--rounds 8]

The offline benchmark's cache shape (SmolLM2-135M: 30 layers, 3 KV heads, head dim 64, block
size 16, fp32; 737 KB a block), a 1,024-block pool and a 256-block host pool. Two ways of
copying, each on a fresh cache:

* ``direct``: the engine's swap on the CPU (each run of consecutive blocks copied straight
  from pool to pool);
* ``staged``: what the CPU swap did before (and what a GPU swap does around its transfer): a
  gather into a fresh buffer and a scatter out of it (``index_select`` then ``index_copy_``).

First the host pool's first touch: four swap-outs of 64 blocks fill it (the engine leaves it
untouched until swaps write it). Then ``--rounds`` rounds each swap ``--blocks`` blocks out
and back in, the pairs either one run of consecutive ids (a victim's blocks, allocated
together) or drawn at random. Prints the medians per way and layout, and the ratios.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.kv_cache import KVCache
from engine.kv_cache_spec import KVCacheSpec

SPEC = KVCacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")

Pairs = list[tuple[int, int]]


def staged(src: torch.Tensor, dst: torch.Tensor, pairs: Pairs) -> None:
    s = torch.tensor([p[0] for p in pairs], dtype=torch.long)
    d = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    dst.index_copy_(0, d, src.index_select(0, s))


def rounds(way: str, layout: str, blocks: int, count: int, seed: int) -> dict[str, float]:
    """Median seconds of the first touches, the swap-outs and the swap-ins."""
    rng = random.Random(seed)
    cache = KVCache(SPEC, 1024, 256, torch.device("cpu"))
    cache.pool.normal_()
    swap_out: Callable[[Pairs], None] = cache.swap_out
    swap_in: Callable[[Pairs], None] = cache.swap_in
    if way == "staged":
        swap_out = lambda p: staged(cache.pool, cache.host_pool, p)  # noqa: E731
        swap_in = lambda p: staged(cache.host_pool, cache.pool, p)  # noqa: E731
    first = []
    for r in range(4):  # fills the untouched host pool
        t0 = time.perf_counter()
        swap_out([(64 * r + i, 64 * r + i) for i in range(64)])
        first.append(time.perf_counter() - t0)
    out_s, in_s = [], []
    for r in range(count):
        if layout == "run":
            d0, h0 = blocks * r % (1024 - blocks), blocks * r % (256 - blocks)
            dev, host = list(range(d0, d0 + blocks)), list(range(h0, h0 + blocks))
        else:
            dev, host = rng.sample(range(1024), blocks), rng.sample(range(256), blocks)
        t0 = time.perf_counter()
        swap_out(list(zip(dev, host, strict=True)))
        t1 = time.perf_counter()
        swap_in(list(zip(host, dev, strict=True)))
        t2 = time.perf_counter()
        assert torch.equal(cache.host_pool[host[-1]], cache.pool[dev[-1]])
        out_s.append(t1 - t0)
        in_s.append(t2 - t1)
    return {
        "first": statistics.median(first),
        "out": statistics.median(out_s),
        "in": statistics.median(in_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    mb = args.blocks * SPEC.bytes_per_block / 1e6
    print(f"{args.blocks} blocks a swap ({mb:.1f} MB), {args.rounds} rounds, torch threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    print(f"{'layout':8} {'way':7} {'first touch ms':>14} {'out ms':>7} {'in ms':>6}")
    for layout in ("run", "random"):
        medians = {}
        for way in ("staged", "direct"):
            medians[way] = m = rounds(way, layout, args.blocks, args.rounds, args.seed)
            print(f"{layout:8} {way:7} {m['first'] * 1e3:14.1f} {m['out'] * 1e3:7.1f} "
                  f"{m['in'] * 1e3:6.1f}")  # fmt: skip
        st, di = medians["staged"], medians["direct"]
        ratios = {k: st[k] / di[k] for k in ("first", "out", "in")}
        print(f"{layout:8} staged / direct: first touch {ratios['first']:.2f}x, "
              f"swap-out {ratios['out']:.2f}x, swap-in {ratios['in']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
