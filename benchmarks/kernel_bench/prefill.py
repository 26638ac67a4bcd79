"""Prefill sections: ``paged_prefill_attention`` on chunks vs gather + SDPA, and a mixed step."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.kernel_bench.common import (
    Bench,
    Shape,
    gather_dense,
    max_err,
    paged_cache,
    table,
)


def bench_prefill(bench: Bench, shape: Shape, configs: list[tuple[int, int, int]]) -> None:
    from kernels.paged_prefill_attention import paged_prefill_attention

    device = bench.device
    scale = shape.head_dim**-0.5
    rows = []
    for num_seqs, context, chunk in configs:
        if bench.out_of_time():
            continue
        seq_len = context + chunk
        k_cache, v_cache, block_tables = paged_cache(shape, num_seqs, seq_len, device)
        q = torch.randn(
            num_seqs * chunk, shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype
        )
        qsl = torch.arange(0, num_seqs * chunk + 1, chunk, dtype=torch.int32, device=device)
        seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device)
        out = torch.empty_like(q)
        # Causal mask aligned at the bottom right: row j sees keys 0 .. context + j.
        visible = (
            torch.arange(seq_len, device=device)[None, :]
            <= context + torch.arange(chunk, device=device)[:, None]
        )

        def triton_fn(
            bt=block_tables, q=q, qsl=qsl, sl=seq_lens, out=out, kc=k_cache, vc=v_cache
        ) -> object:
            return paged_prefill_attention(q, kc, vc, bt, qsl, sl, scale, out=out)

        def gather_sdpa(
            bt=block_tables,
            q=q,
            n=num_seqs,
            chunk=chunk,
            seq_len=seq_len,
            mask=visible,
            kc=k_cache,
            vc=v_cache,
            context=context,
        ) -> object:
            k = gather_dense(kc, bt, seq_len)
            v = gather_dense(vc, bt, seq_len)
            qd = q.view(n, chunk, shape.num_heads, shape.head_dim).transpose(1, 2)
            if context == 0:
                return F.scaled_dot_product_attention(
                    qd, k, v, scale=scale, is_causal=True, enable_gqa=True
                )
            return F.scaled_dot_product_attention(
                qd, k, v, attn_mask=mask, scale=scale, enable_gqa=True
            )

        pairs = num_seqs * (chunk * context + chunk * (chunk + 1) // 2)
        flops = 4 * pairs * shape.num_heads * shape.head_dim
        reference = gather_sdpa()  # [seqs, heads, chunk, dim]
        assert isinstance(reference, torch.Tensor)
        err = max_err(triton_fn(), reference.transpose(1, 2).reshape(q.shape))
        ms_t, ms_g = bench.time_ms(triton_fn), bench.time_ms(gather_sdpa)
        rows.append(
            [
                str(num_seqs),
                str(context),
                str(chunk),
                f"{ms_t * 1e3:.0f}",
                f"{ms_g * 1e3:.0f}",
                f"{flops / (ms_t * 1e-3) / 1e12:.0f}",
                f"{flops / (ms_g * 1e-3) / 1e12:.0f}",
                f"{ms_g / ms_t:.1f}x",
                err,
            ]
        )
        del k_cache, v_cache, block_tables
    table(
        "chunked-prefill attention (new tokens over existing context)",
        [
            "seqs",
            "context",
            "chunk",
            "triton us",
            "gather+SDPA us",
            "triton TFLOP/s",
            "SDPA TFLOP/s",
            "speedup",
            "max err",
        ],
        rows,
    )


def bench_mixed(bench: Bench, shape: Shape, chunk: int, context: int, num_decodes: int) -> None:
    """One prefill chunk plus decodes: a single unified launch vs prefill + decode launches."""
    from kernels.paged_decode_attention import default_num_splits, paged_decode_attention
    from kernels.paged_prefill_attention import paged_prefill_attention

    if bench.out_of_time():
        return
    device = bench.device
    scale = shape.head_dim**-0.5
    num_seqs = 1 + num_decodes
    seq_len = context + chunk
    k_cache, v_cache, block_tables = paged_cache(shape, num_seqs, seq_len, device)
    query_lens = [chunk] + [1] * num_decodes
    seq_lens = torch.tensor(
        [seq_len] + [context + 1] * num_decodes, dtype=torch.int32, device=device
    )
    qsl = torch.tensor(
        [0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device
    )
    q = torch.randn(
        sum(query_lens), shape.num_heads, shape.head_dim, device=device, dtype=shape.dtype
    )
    out = torch.empty_like(q)
    splits = default_num_splits(num_decodes, shape.num_kv_heads, context + 1)

    def unified() -> object:
        return paged_prefill_attention(
            q, k_cache, v_cache, block_tables, qsl, seq_lens, scale, out=out
        )

    def two_launches() -> object:
        paged_prefill_attention(
            q[:chunk],
            k_cache,
            v_cache,
            block_tables[:1],
            qsl[:2],
            seq_lens[:1],
            scale,
            out=out[:chunk],
        )
        return paged_decode_attention(
            q[chunk:],
            k_cache,
            v_cache,
            block_tables[1:],
            seq_lens[1:],
            scale,
            splits,
            out=out[chunk:],
        )

    unified_out = unified()
    assert isinstance(unified_out, torch.Tensor)
    unified_out = unified_out.clone()
    two_launches()
    err = max_err(unified_out, out)
    ms_u, ms_s = bench.time_ms(unified), bench.time_ms(two_launches)
    table(
        f"mixed step: 1 chunk of {chunk} over {context} + {num_decodes} decodes at {context}",
        ["unified launch us", "prefill + decode launches us", "unified / two", "max diff"],
        [[f"{ms_u * 1e3:.0f}", f"{ms_s * 1e3:.0f}", f"{ms_u / ms_s:.2f}", err]],
    )
