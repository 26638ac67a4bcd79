"""KV store and block copy sections: ``store_kv`` vs index_put, ``copy_blocks`` vs index ops."""

from __future__ import annotations

import torch

from benchmarks.kernel_bench.common import Bench, Shape, kv_pool, table


def bench_store_and_copy(
    bench: Bench, shape: Shape, token_counts: list[int], pair_counts: list[int], num_layers: int
) -> None:
    from kernels.block_copy import copy_blocks
    from kernels.kv_store import store_kv

    device = bench.device
    max_tokens = max(token_counts)
    num_blocks = 2 * max_tokens // shape.block_size + 1
    pool, k_cache, v_cache = kv_pool(shape, num_blocks, device)
    rows = []
    for n in token_counts:
        if bench.out_of_time():
            continue
        slots = torch.randperm(num_blocks * shape.block_size, device=device)[:n]
        k = torch.randn(n, shape.num_kv_heads, shape.head_dim, device=device, dtype=shape.dtype)
        v = torch.randn_like(k)

        def triton_fn(k=k, v=v, slots=slots) -> object:
            store_kv(k, v, k_cache, v_cache, slots)
            return None

        def torch_fn(k=k, v=v, slots=slots) -> object:
            blk, off = slots // shape.block_size, slots % shape.block_size
            k_cache[blk, off] = k
            v_cache[blk, off] = v
            return None

        moved = 2 * n * shape.kv_bytes_per_token  # read k, v and write them
        triton_fn()
        blk, off = slots // shape.block_size, slots % shape.block_size
        exact = bool(torch.equal(k_cache[blk, off], k) and torch.equal(v_cache[blk, off], v))
        ms_t, ms_b = bench.time_ms(triton_fn), bench.time_ms(torch_fn)
        rows.append(
            [
                str(n),
                f"{ms_t * 1e3:.1f}",
                f"{ms_b * 1e3:.1f}",
                f"{bench.gbps(moved, ms_t):.0f}",
                f"{ms_b / ms_t:.1f}x",
                "yes" if exact else "NO",
            ]
        )
    table(
        "kv store (one layer)",
        ["tokens", "triton us", "index_put us", "triton GB/s", "speedup", "exact"],
        rows,
    )
    del pool

    # Block copy over a whole block-major pool: a block holds every layer's K and V.
    block_shape = (num_layers, 2, shape.block_size, shape.num_kv_heads, shape.head_dim)
    max_pairs = max(pair_counts)
    block_pool = torch.randn(2 * max_pairs, *block_shape, device=device, dtype=shape.dtype)
    block_bytes = block_pool[0].numel() * block_pool.element_size()
    rows = []
    for n in pair_counts:
        if bench.out_of_time():
            continue
        perm = torch.randperm(2 * max_pairs, device=device)
        src, dst = perm[:n], perm[n : 2 * n]

        def triton_copy(src=src, dst=dst) -> object:
            copy_blocks(block_pool, block_pool, src, dst)
            return None

        def torch_copy(src=src, dst=dst) -> object:
            block_pool.index_copy_(0, dst, block_pool.index_select(0, src))
            return None

        triton_copy()
        exact = bool(torch.equal(block_pool[dst], block_pool[src]))
        ms_t, ms_b = bench.time_ms(triton_copy), bench.time_ms(torch_copy)
        rows.append(
            [
                str(n),
                f"{block_bytes / 2**20:.1f}",
                f"{ms_t * 1e3:.0f}",
                f"{ms_b * 1e3:.0f}",
                f"{bench.gbps(2 * n * block_bytes, ms_t):.0f}",
                f"{ms_b / ms_t:.1f}x",
                "yes" if exact else "NO",
            ]
        )
    table(
        "block copy (copy-on-write within a pool)",
        [
            "pairs",
            "MiB/block",
            "triton us",
            "index_select+copy us",
            "triton GB/s",
            "speedup",
            "exact",
        ],
        rows,
    )
