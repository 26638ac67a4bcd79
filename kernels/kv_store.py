"""KV store: write a step's new K/V rows into one layer's paged cache through the slot mapping.

    slot_mapping[t] = block_id * block_size + offset   ->   k_cache[block_id, offset] = k[t]
    slot_mapping[t] = -1                               ->   row t is padding, nothing written

One program per token writes all its KV heads. The cache is a strided view of the block-major
pool (``kv_pool[:, layer, 0]``), so every stride is passed in; only the head_dim stride must be 1.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.

import torch
import triton
import triton.language as tl

from kernels._common import check_device, next_power_of_2


@triton.jit
def _store_kv_kernel(  # type: ignore[no-untyped-def]
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    v_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strided view of the pool
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], strided view of the pool
    slot_mapping_ptr,  # [num_tokens] int64, -1 = skip
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_head,
    num_kv_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_H: tl.constexpr,  # num_kv_heads rounded up to a power of 2
    BLOCK_D: tl.constexpr,  # head_dim rounded up to a power of 2
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    # int64: block_id * stride_blk exceeds 2^31 elements in pools over a few GiB.
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    num_heads_to_write = tl.where(slot >= 0, num_kv_heads, 0)  # padding row: write nothing
    mask = (h[:, None] < num_heads_to_write) & (d[None, :] < head_dim)

    k = tl.load(k_ptr + tok * stride_k_tok + h[:, None] * stride_k_head + d[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_v_tok + h[:, None] * stride_v_head + d[None, :], mask=mask)
    kc = k_cache_ptr + blk * stride_kc_blk + off * stride_kc_slot
    vc = v_cache_ptr + blk * stride_vc_blk + off * stride_vc_slot
    tl.store(kc + h[:, None] * stride_kc_head + d[None, :], k, mask=mask)
    tl.store(vc + h[:, None] * stride_vc_head + d[None, :], v, mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k[t]``/``v[t]`` to flat slot ``slot_mapping[t]`` of the caches (in place).

    ``k``, ``v``: ``[num_tokens, num_kv_heads, head_dim]``; caches:
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` (any strides, head_dim stride 1);
    ``slot_mapping``: ``[num_tokens]`` int64 (or int32), ``-1`` rows are skipped. Slots must be
    distinct (two rows writing one slot race).
    """
    assert k.dim() == 3 and v.shape == k.shape, f"k {tuple(k.shape)} / v {tuple(v.shape)}"
    assert k_cache.dim() == 4 and v_cache.shape == k_cache.shape
    num_tokens, num_kv_heads, head_dim = k.shape
    _, block_size, cache_heads, cache_dim = k_cache.shape
    assert (cache_heads, cache_dim) == (num_kv_heads, head_dim), "cache/kv head shape mismatch"
    assert slot_mapping.shape == (num_tokens,), f"slot_mapping {tuple(slot_mapping.shape)}"
    assert slot_mapping.dtype in (torch.int64, torch.int32)
    assert k.dtype == v.dtype == k_cache.dtype == v_cache.dtype, "k/v/cache dtypes differ"
    for t in (k, v, k_cache, v_cache):
        assert t.stride(-1) == 1, "head_dim must be the contiguous dimension"
    check_device(k, v, k_cache, v_cache, slot_mapping)
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        num_kv_heads,
        head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=next_power_of_2(num_kv_heads),
        BLOCK_D=next_power_of_2(head_dim),
    )
