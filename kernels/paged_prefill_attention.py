"""Chunked-prefill attention over the paged cache, variable lengths in one launch.

Also serves decode tokens (a request with one new token is a chunk of length 1), so one launch
covers a whole mixed step. Request ``i``'s new tokens are rows ``query_start_loc[i] :
query_start_loc[i + 1]`` of ``q``; their K/V are already in the cache (written by
``kv_store`` first), so the kernel reads keys only through the block table:

    request i:  | context (seq_len - query_len) | new tokens (query_len) |
    new token j sits at position context + j and sees cached positions 0 .. context + j
    (with a sliding window W: context + j - W + 1 .. context + j)

Grid: (query tiles, KV heads). A query tile holds ``BLOCK_Q`` consecutive new tokens of one
request times the ``QUERIES_PER_KV`` query heads sharing the KV head (``BLOCK_M`` rows, row
``r`` = token ``r // QUERIES_PER_KV``, head ``r % QUERIES_PER_KV``). Tiles are numbered without
a host-side plan: request ``i``'s tiles start at ``query_start_loc[i] // BLOCK_Q + i`` (at least
``ceil(query_len / BLOCK_Q)`` apart), each program binary-searches its request and exits if its
tile is past the request's end; ``num_tokens // BLOCK_Q + num_seqs`` programs cover every batch.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.

import torch
import triton
import triton.language as tl

from kernels._common import check_device, next_power_of_2

_LOG2E = 1.4426950408889634
_NO_WINDOW = 2**31 - 1


@triton.jit
def _paged_prefill_kernel(  # type: ignore[no-untyped-def]
    out_ptr,  # [num_tokens, num_heads, head_dim]
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strided
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strided
    block_tables_ptr,  # [num_seqs, max_num_blocks] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32, context + new tokens
    qk_scale,  # softmax scale * log2(e)
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_head,
    stride_bt_seq,
    num_seqs,
    head_dim,
    sliding_window,  # keys (p - window, p] for a query at p; 2^31 - 1 = no window
    QUERIES_PER_KV: tl.constexpr,  # num_heads // num_kv_heads
    BLOCK_Q: tl.constexpr,  # new tokens per query tile
    BLOCK_M: tl.constexpr,  # BLOCK_Q * QUERIES_PER_KV padded to a power of 2 >= 16
    BLOCK_D: tl.constexpr,  # head_dim padded to a power of 2 >= 16
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    TILE_N: tl.constexpr,  # keys per inner iteration, a multiple of BLOCK_SIZE
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (exact), "tf32" otherwise (ignored for 16-bit)
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)

    # Largest request i with query_start_loc[i] // BLOCK_Q + i <= tile (strictly increasing in i).
    lo = tl.program_id(0) * 0
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        go_right = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    seq = lo.to(tl.int64)

    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tok0 = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first new token of this tile
    if tok0 >= query_len:
        return
    context_len = tl.load(seq_lens_ptr + seq) - query_len

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    q_tok = tok0 + r // QUERIES_PER_KV  # [BLOCK_M] index among the request's new tokens
    head = kv_head * QUERIES_PER_KV + r % QUERIES_PER_KV  # [BLOCK_M]
    row_mask = (r // QUERIES_PER_KV < BLOCK_Q) & (q_tok < query_len)
    d_mask = d < head_dim
    q_row = (q_start + q_tok).to(tl.int64)  # [BLOCK_M] row of the flat batch
    q = tl.load(
        q_ptr + q_row[:, None] * stride_q_tok + head[:, None] * stride_q_head + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    kv_end = context_len + tl.minimum(tok0 + BLOCK_Q, query_len)  # last row's position + 1
    # Rows past the chunk end act as its last row, so every row sees at least its own key.
    q_pos = tl.minimum(context_len + q_tok, kv_end - 1)  # [BLOCK_M] each row's position
    kv_start = tl.maximum(context_len + tok0 - sliding_window + 1, 0)  # first row's first key

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n = tl.arange(0, TILE_N)
    block_table = block_tables_ptr + seq * stride_bt_seq
    for tile_start in range(kv_start, kv_end, TILE_N):
        pos = tile_start + n  # [TILE_N] key positions
        n_mask = pos < kv_end
        # int64: a block id times the block stride passes 2^31 elements in pools of a few GiB.
        blk = tl.load(block_table + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        off = pos % BLOCK_SIZE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(
            k_cache_ptr
            + blk[:, None] * stride_kc_blk
            + off[:, None] * stride_kc_slot
            + kv_head * stride_kc_head
            + d[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [TILE_N, BLOCK_D]
        v = tl.load(
            v_cache_ptr
            + blk[:, None] * stride_vc_blk
            + off[:, None] * stride_vc_slot
            + kv_head * stride_vc_head
            + d[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [TILE_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N]
        visible = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
        visible = visible & (pos[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row whose window starts after this tile has seen no key yet: keep its terms at 0.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(
        out_ptr + q_row[:, None] * stride_o_tok + head[:, None] * stride_o_head + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    block_m: int = 64,
    tile_n: int | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its paged cache (mixed batch).

    ``q``: ``[num_tokens, num_heads, head_dim]`` (flat batch); caches ``[num_blocks,
    block_size, num_kv_heads, head_dim]`` (any strides, head_dim stride 1), already holding
    the new tokens' K/V; ``block_tables``: ``[num_seqs, max_num_blocks]`` int32;
    ``query_start_loc``: ``[num_seqs + 1]`` int32; ``seq_lens``: ``[num_seqs]`` int32
    (context + new). Returns ``out`` (allocated when None) ``[num_tokens, num_heads, head_dim]``;
    rows past ``query_start_loc[-1]`` (padding) are zero when ``out`` is allocated here and
    untouched otherwise. ``sliding_window``: a query at position ``p`` sees only keys
    ``p - window + 1 .. p`` (None: all earlier keys).
    """
    assert q.dim() == 3 and k_cache.dim() == 4 and v_cache.shape == k_cache.shape
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    assert cache_dim == head_dim, f"head_dim {head_dim} vs cache {cache_dim}"
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.dtype == k_cache.dtype == v_cache.dtype, "q/cache dtypes differ"
    assert q.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
    num_seqs = seq_lens.shape[0]
    assert seq_lens.dim() == 1 and seq_lens.dtype == torch.int32
    assert query_start_loc.shape == (num_seqs + 1,) and query_start_loc.dtype == torch.int32
    assert block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
    assert block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
    assert query_start_loc.is_contiguous() and seq_lens.is_contiguous()
    assert sliding_window is None or sliding_window >= 1
    if out is None:
        out = torch.zeros_like(q)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1
    check_device(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out)
    if num_seqs == 0 or num_tokens == 0:
        return out

    queries_per_kv = num_heads // num_kv_heads
    block_m = max(16, next_power_of_2(block_m), next_power_of_2(queries_per_kv))
    block_q = block_m // queries_per_kv
    if tile_n is None:
        tile_n = max(block_size, 64 if head_dim <= 128 else 32)
    assert tile_n % block_size == 0, "tile_n must be a multiple of block_size"
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    num_tiles = num_tokens // block_q + num_seqs
    _paged_prefill_kernel[(num_tiles, num_kv_heads)](
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        num_seqs,
        head_dim,
        _NO_WINDOW if sliding_window is None else min(sliding_window, _NO_WINDOW),
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_D=max(16, next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        TILE_N=tile_n,
        DOT_PRECISION=precision,
        # fp32 (the exactness path) keeps K/V tiles out of a multi-stage shared-memory pipeline:
        # 3 stages of fp32 K and V tiles would not fit; speed is not what fp32 is run for.
        num_stages=1 if q.dtype == torch.float32 else 3,
        num_warps=4,
    )
    return out
