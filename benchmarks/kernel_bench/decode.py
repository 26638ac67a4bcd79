"""Decode sections: ``paged_decode_attention`` vs SDPA baselines, and its tile x warps sweep."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from benchmarks.kernel_bench.common import (
    Bench,
    Shape,
    gather_dense,
    kv_pool,
    max_err,
    num_sms,
    paged_cache,
    paged_setup,
    table,
)


def bench_decode(
    bench: Bench, shape: Shape, contexts: list[int], batches: list[int], max_tokens: int
) -> None:
    from kernels.paged_decode_attention import default_num_splits, paged_decode_attention

    device = bench.device
    sms = num_sms(device)
    pool_tokens = max(b * c for b in batches for c in contexts if b * c <= max_tokens)
    num_blocks = pool_tokens // shape.block_size + 1
    pool, k_cache, v_cache = kv_pool(shape, num_blocks, device)
    perm = torch.randperm(num_blocks, device=device)
    scale = shape.head_dim**-0.5
    rows = []
    for context in contexts:
        for batch in batches:
            if batch * context > max_tokens:
                continue
            if bench.out_of_time():
                continue
            block_tables = paged_setup(shape, batch, context, pool, perm)
            seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
            q = torch.randn(
                batch, shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype
            )
            splits = default_num_splits(batch, shape.num_kv_heads, context, sms)
            out = torch.empty_like(q)

            def triton_split(bt=block_tables, sl=seq_lens, q=q, out=out, s=splits) -> object:
                return paged_decode_attention(q, k_cache, v_cache, bt, sl, scale, s, out=out)

            def triton_nosplit(bt=block_tables, sl=seq_lens, q=q, out=out) -> object:
                return paged_decode_attention(q, k_cache, v_cache, bt, sl, scale, 1, out=out)

            def gather_sdpa(bt=block_tables, q=q, context=context) -> object:
                k = gather_dense(k_cache, bt, context)
                v = gather_dense(v_cache, bt, context)
                return F.scaled_dot_product_attention(
                    q.unsqueeze(2), k, v, scale=scale, enable_gqa=True
                )

            k_dense = gather_dense(k_cache, block_tables, context).contiguous()
            v_dense = gather_dense(v_cache, block_tables, context).contiguous()

            def dense_sdpa(q=q, k=k_dense, v=v_dense) -> object:
                return F.scaled_dot_product_attention(
                    q.unsqueeze(2), k, v, scale=scale, enable_gqa=True
                )

            expected = dense_sdpa().squeeze(2)  # type: ignore[attr-defined]
            err = max(
                float(max_err(triton_split(), expected)),
                float(max_err(triton_nosplit(), expected)),
            )
            kv_bytes = batch * context * shape.kv_bytes_per_token
            ms = {
                "split": bench.time_ms(triton_split),
                "nosplit": bench.time_ms(triton_nosplit),
                "gather": bench.time_ms(gather_sdpa),
                "dense": bench.time_ms(dense_sdpa),
            }
            best = min(ms["split"], ms["nosplit"])
            gbps = bench.gbps(kv_bytes, ms["split"])
            rows.append(
                [
                    str(context),
                    str(batch),
                    str(splits),
                    f"{ms['split'] * 1e3:.1f}",
                    f"{ms['nosplit'] * 1e3:.1f}",
                    f"{ms['gather'] * 1e3:.1f}",
                    f"{ms['dense'] * 1e3:.1f}",
                    f"{gbps:.0f}",
                    f"{100 * gbps / bench.peak_gbps:.0f}%",
                    f"{ms['gather'] / ms['split']:.1f}x",
                    f"{ms['dense'] / best:.2f}x",
                    f"{err:.1e}",
                ]
            )
            del k_dense, v_dense, dense_sdpa  # the closure holds the dense copies too
    table(
        "decode attention (one token per sequence)",
        [
            "context",
            "batch",
            "splits",
            "triton us",
            "unsplit us",
            "gather+SDPA us",
            "dense SDPA us",
            "triton GB/s",
            "% peak",
            "vs gather+SDPA",
            "vs dense SDPA",
            "max err",
        ],
        rows,
    )
    del pool


def bench_decode_sweep(
    bench: Bench,
    shape: Shape,
    configs: list[tuple[int, int]],
    tile_ns: list[int],
    warps: list[int],
) -> None:
    """Decode tile size x warps at a few (batch, context) points, to check the defaults."""
    from kernels.paged_decode_attention import default_num_splits, paged_decode_attention

    device = bench.device
    sms = num_sms(device)
    scale = shape.head_dim**-0.5
    rows = []
    for batch, context in configs:
        if bench.out_of_time():
            continue
        k_cache, v_cache, block_tables = paged_cache(shape, batch, context, device)
        seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        q = torch.randn(batch, shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype)
        out = torch.empty_like(q)
        splits = default_num_splits(batch, shape.num_kv_heads, context, sms)
        kv_bytes = batch * context * shape.kv_bytes_per_token
        cells = []
        for tile_n in tile_ns:
            for num_warps in warps:
                if tile_n % shape.block_size:
                    cells.append("-")
                    continue

                fn = functools.partial(
                    paged_decode_attention,
                    q,
                    k_cache,
                    v_cache,
                    block_tables,
                    seq_lens,
                    scale,
                    splits,
                    out=out,
                    tile_n=tile_n,
                    num_warps=num_warps,
                )
                cells.append(f"{bench.gbps(kv_bytes, bench.time_ms(fn)):.0f}")
        rows.append([str(batch), str(context), str(splits), *cells])
        del k_cache, v_cache, block_tables
    table(
        "decode tile sweep: GB/s by TILE_N x num_warps (defaults: 64 x 4)",
        ["batch", "context", "splits"] + [f"{t} x {w}" for t in tile_ns for w in warps],
        rows,
    )
