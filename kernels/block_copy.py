"""Block copy: whole KV blocks from one pool to another (or within one), by block id pairs.

In the block-major pool ``kv_pool[num_blocks, num_layers, 2, block_size, num_kv_heads,
head_dim]`` one block (all layers' K and V) is one contiguous span, so a copy is a flat copy of
``elements_per_block`` elements per pair:

    dst_pool[dst_block_ids[i]] = src_pool[src_block_ids[i]]     for every i, in one launch

``copy_blocks`` runs the kernel (copy-on-write within a pool, or between two pools on one
device). ``swap_blocks`` moves blocks between a device pool and a host pool (swap out / swap
in): one gather on the source side, one transfer, one scatter on the destination side.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernels._common import check_device


@triton.jit
def _copy_blocks_kernel(  # type: ignore[no-untyped-def]
    src_ptr,  # [num_src_blocks, elements_per_block], row stride stride_src_blk
    dst_ptr,  # [num_dst_blocks, elements_per_block], row stride stride_dst_blk
    src_block_ids_ptr,  # [num_pairs] int64
    dst_block_ids_ptr,  # [num_pairs] int64
    stride_src_blk,
    stride_dst_blk,
    elements_per_block,
    CHUNK: tl.constexpr,  # elements per program
):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    # int64: block id * block stride passes 2^31 elements in any pool over a few GiB.
    src_blk = tl.load(src_block_ids_ptr + pair).to(tl.int64)
    dst_blk = tl.load(dst_block_ids_ptr + pair).to(tl.int64)
    offs = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < elements_per_block
    x = tl.load(src_ptr + src_blk * stride_src_blk + offs, mask=mask)
    tl.store(dst_ptr + dst_blk * stride_dst_blk + offs, x, mask=mask)


def _check_pool(pool: torch.Tensor) -> None:
    """Each block must be one contiguous span (dims after the first are packed)."""
    expected = 1
    for size, stride in zip(reversed(pool.shape[1:]), reversed(pool.stride()[1:]), strict=True):
        assert size == 1 or stride == expected, f"pool blocks are not contiguous: {pool.stride()}"
        expected *= size


def copy_blocks(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
    chunk: int = 4096,
) -> None:
    """``dst_pool[dst_block_ids[i]] = src_pool[src_block_ids[i]]`` for all i, in one launch.

    Pools: ``[num_blocks, *block_shape]`` with equal block shapes and dtypes, each block
    contiguous, on one device (``src_pool is dst_pool`` for copy-on-write). Ids: ``[num_pairs]``
    int64/int32 on that device. Destination blocks must be distinct and, within one pool, must
    not also be sources (the pairs are copied in parallel).
    """
    assert src_pool.dim() >= 2 and src_pool.shape[1:] == dst_pool.shape[1:], "block shapes differ"
    assert src_pool.dtype == dst_pool.dtype, "pool dtypes differ"
    assert src_pool.device == dst_pool.device, "use swap_blocks across devices"
    _check_pool(src_pool)
    _check_pool(dst_pool)
    assert src_block_ids.dim() == 1 and src_block_ids.shape == dst_block_ids.shape
    assert src_block_ids.dtype in (torch.int32, torch.int64) and dst_block_ids.dtype in (
        torch.int32,
        torch.int64,
    )
    assert chunk > 0 and chunk & (chunk - 1) == 0, "chunk must be a power of 2"
    check_device(src_pool, dst_pool, src_block_ids, dst_block_ids)
    num_pairs = src_block_ids.shape[0]
    if num_pairs == 0:
        return
    elements_per_block = src_pool[0].numel()
    grid = (num_pairs, -(-elements_per_block // chunk))
    _copy_blocks_kernel[grid](
        src_pool,
        dst_pool,
        src_block_ids,
        dst_block_ids,
        src_pool.stride(0),
        dst_pool.stride(0),
        elements_per_block,
        CHUNK=chunk,
    )


def swap_blocks(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    block_mapping: Sequence[tuple[int, int]],
) -> None:
    """Copy blocks ``src -> dst`` for each ``(src, dst)`` pair, across devices (swap in/out).

    Gathers the source blocks into one staging tensor on the source device, moves it in one
    transfer and scatters it into the destination pool. Works for any pair of devices,
    including two CPU pools. On return a swap-out (device to host) is complete; a swap-in is
    ordered on the current stream before any later kernel that reads the device pool.
    """
    assert src_pool.shape[1:] == dst_pool.shape[1:], "block shapes differ"
    assert src_pool.dtype == dst_pool.dtype, "pool dtypes differ"
    if not block_mapping:
        return
    src_ids = torch.tensor([s for s, _ in block_mapping], dtype=torch.int64)
    dst_ids = torch.tensor([d for _, d in block_mapping], dtype=torch.int64)
    staging = src_pool.index_select(0, src_ids.to(src_pool.device))
    # Host-to-device may be asynchronous (stream-ordered before the scatter); device-to-host
    # must not be, or the host scatter below could read the staging buffer before it lands.
    staging = staging.to(dst_pool.device, non_blocking=dst_pool.device.type == "cuda")
    dst_pool.index_copy_(0, dst_ids.to(dst_pool.device), staging)
