"""Paged decode attention: one query token per sequence against its whole paged KV history.

One program per (sequence, KV head, split). It loads the query rows of every query head that
shares the KV head (GQA/MQA: ``num_heads // num_kv_heads`` rows, padded to 16 for ``tl.dot``),
so each K/V byte is read once per step, and walks the sequence's tokens in tiles of ``TILE_N``
(several cache blocks per tile; each token's block comes from the block table) with an online
softmax.

Split-KV (flash-decoding) for long contexts and few sequences: the visible token range is cut
into ``num_splits`` contiguous pieces, each program writes its normalized partial output and
log-sum-exp, and a second kernel merges them:

    k0 = first visible key: 0, or seq_len - window with a sliding window
    L  = ceil((seq_len - k0) / num_splits), rounded up to a multiple of TILE_N
    split s covers keys [k0 + s * L, min(k0 + (s + 1) * L, seq_len))   (may be empty)
    out = sum_s 2^(lse_s - max lse) * out_s / sum_s 2^(lse_s - max lse)

With ``num_splits == 1`` the first kernel writes the final output directly.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.

import torch
import triton
import triton.language as tl

from kernels._common import check_device, next_power_of_2

_LOG2E = 1.4426950408889634
_NO_WINDOW = 2**31 - 1


@triton.jit
def _paged_decode_kernel(  # type: ignore[no-untyped-def]
    out_ptr,  # [num_seqs, num_heads, head_dim]                         (NUM_SPLITS == 1)
    partial_out_ptr,  # [num_seqs, num_heads, NUM_SPLITS, head_dim] fp32  (NUM_SPLITS > 1)
    partial_lse_ptr,  # [num_seqs, num_heads, NUM_SPLITS] fp32, log2 units (NUM_SPLITS > 1)
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strided
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strided
    block_tables_ptr,  # [num_seqs, max_num_blocks] int32
    seq_lens_ptr,  # [num_seqs] int32
    qk_scale,  # softmax scale * log2(e)
    stride_q_seq,
    stride_q_head,
    stride_o_seq,
    stride_o_head,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_head,
    stride_bt_seq,
    head_dim,
    sliding_window,  # keys (p - window, p] for a query at p; 2^31 - 1 = no window
    QUERIES_PER_KV: tl.constexpr,  # num_heads // num_kv_heads
    BLOCK_G: tl.constexpr,  # QUERIES_PER_KV padded to a power of 2 >= 16
    BLOCK_D: tl.constexpr,  # head_dim padded to a power of 2 >= 16
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    TILE_N: tl.constexpr,  # tokens per inner iteration, a multiple of BLOCK_SIZE
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (exact), "tf32" otherwise (ignored for 16-bit)
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    kv_start = tl.maximum(seq_len - sliding_window, 0)  # first key the query sees
    tokens_per_split = tl.cdiv(tl.cdiv(seq_len - kv_start, NUM_SPLITS), TILE_N) * TILE_N
    start = kv_start + split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    head = kv_head * QUERIES_PER_KV + g  # [BLOCK_G]
    g_mask = g < QUERIES_PER_KV
    d_mask = d < head_dim
    q = tl.load(
        q_ptr + seq * stride_q_seq + head[:, None] * stride_q_head + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_G, BLOCK_D]

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    n = tl.arange(0, TILE_N)
    block_table = block_tables_ptr + seq * stride_bt_seq
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + n  # [TILE_N] token positions
        n_mask = pos < end
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
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_G, TILE_N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + seq * stride_o_seq + head[:, None] * stride_o_head + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:
        # An empty split (short sequence) has l_i == 0: write zeros and lse = -inf (weight 0).
        has_tokens = l_i > 0
        out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        row = (seq * tl.num_programs(1) * QUERIES_PER_KV + head) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(partial_out_ptr + row[:, None] * head_dim + d[None, :], out, mask=out_mask)
        tl.store(partial_lse_ptr + row, lse, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(  # type: ignore[no-untyped-def]
    out_ptr,  # [num_seqs, num_heads, head_dim]
    partial_out_ptr,  # [num_seqs, num_heads, NUM_SPLITS, head_dim] fp32, contiguous
    partial_lse_ptr,  # [num_seqs, num_heads, NUM_SPLITS] fp32, contiguous, log2 units
    stride_o_seq,
    stride_o_head,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,  # NUM_SPLITS padded to a power of 2
    BLOCK_D: tl.constexpr,  # head_dim padded to a power of 2
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row0 = (seq * tl.num_programs(1) + head) * NUM_SPLITS  # first split row of this (seq, head)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    d_mask = d < head_dim
    lse = tl.load(partial_lse_ptr + row0 + s, mask=s_mask, other=float("-inf"))  # [BLOCK_S]
    w = tl.exp2(lse - tl.max(lse, axis=0))  # split 0 always has tokens, so max is finite
    part = tl.load(
        partial_out_ptr + (row0 + s)[:, None] * head_dim + d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    out = tl.sum(part * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def default_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int = 132
) -> int:
    """Splits that give the GPU about 4 programs per SM when (seq, KV head) pairs alone do not.

    Each split keeps >= 512 tokens so the partial writes and the reduce stay a small fraction of
    the K/V traffic; at most 32 splits. ``num_sms`` defaults to the H100/H200's 132.
    """
    programs = num_seqs * num_kv_heads
    target = 4 * num_sms
    if programs >= target or max_seq_len <= 1024:
        return 1
    by_occupancy = -(-target // programs)
    by_length = max_seq_len // 512
    return max(1, min(32, by_occupancy, by_length))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int = 1,
    out: torch.Tensor | None = None,
    tile_n: int | None = None,
    sliding_window: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Attention of one new token per sequence over its cached tokens ``0 .. seq_lens[i] - 1``.

    ``q``: ``[num_seqs, num_heads, head_dim]``; caches ``[num_blocks, block_size, num_kv_heads,
    head_dim]`` (any strides, head_dim stride 1), already holding the new token's K/V;
    ``block_tables``: ``[num_seqs, max_num_blocks]`` int32; ``seq_lens``: ``[num_seqs]`` int32,
    each >= 1. Returns ``out`` (allocated when None) ``[num_seqs, num_heads, head_dim]`` in
    ``q``'s dtype. ``num_splits > 1`` selects the split-KV variant. ``sliding_window``: the
    query at position ``p`` sees only keys ``p - window + 1 .. p`` (None: all). ``tile_n``
    (tokens per inner iteration, a multiple of the block size; default 64) and ``num_warps``
    are tuning knobs for the benchmark's sweep.
    """
    assert q.dim() == 3 and k_cache.dim() == 4 and v_cache.shape == k_cache.shape
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    assert cache_dim == head_dim, f"head_dim {head_dim} vs cache {cache_dim}"
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.dtype == k_cache.dtype == v_cache.dtype, "q/cache dtypes differ"
    assert q.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
    assert block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
    assert block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
    assert seq_lens.shape == (num_seqs,) and seq_lens.dtype == torch.int32
    assert num_splits >= 1
    assert sliding_window is None or sliding_window >= 1
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1
    check_device(q, k_cache, v_cache, block_tables, seq_lens, out)
    if num_seqs == 0:
        return out

    queries_per_kv = num_heads // num_kv_heads
    block_g = max(16, next_power_of_2(queries_per_kv))
    block_d = max(16, next_power_of_2(head_dim))
    if tile_n is None:
        tile_n = max(block_size, 64)
    assert tile_n % block_size == 0, "tile_n must be a multiple of block_size"
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if num_splits > 1:
        partial_out = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        partial_lse = torch.empty(
            (num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device
        )
    else:
        partial_out = partial_lse = out  # unused
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        out,
        partial_out,
        partial_lse,
        q,
        k_cache,
        v_cache,
        block_tables,
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
        head_dim,
        _NO_WINDOW if sliding_window is None else min(sliding_window, _NO_WINDOW),
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_G=block_g,
        BLOCK_D=block_d,
        BLOCK_SIZE=block_size,
        TILE_N=tile_n,
        NUM_SPLITS=num_splits,
        DOT_PRECISION=precision,
        # fp32 (the exactness path) keeps K/V tiles out of a multi-stage shared-memory pipeline:
        # 3 stages of fp32 K and V tiles would not fit; speed is not what fp32 is run for.
        num_stages=1 if q.dtype == torch.float32 else 3,
        num_warps=num_warps,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            out,
            partial_out,
            partial_lse,
            out.stride(0),
            out.stride(1),
            head_dim,
            NUM_SPLITS=num_splits,
            BLOCK_S=next_power_of_2(num_splits),
            BLOCK_D=next_power_of_2(head_dim),
        )
    return out
