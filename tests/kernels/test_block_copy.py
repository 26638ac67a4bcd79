import pytest
import torch

from kernels.block_copy import copy_blocks, swap_blocks


def _pool(num_blocks, device, dtype=torch.float32):
    # [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim], block-major.
    return torch.randn(num_blocks, 2, 2, 16, 2, 8, device=device).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_copy_on_write_within_one_pool(dtype, device):
    pool = _pool(10, device, dtype)
    expected = pool.clone()
    src = torch.tensor([1, 3, 4], device=device)
    dst = torch.tensor([7, 8, 2], device=device)

    copy_blocks(pool, pool, src, dst, chunk=256)  # 1024 elements per block: 4 chunks each

    expected[dst] = expected[src]
    assert torch.equal(pool, expected)


def test_copy_between_pools_with_int32_ids(device):
    src_pool, dst_pool = _pool(6, device), _pool(4, device)
    expected = dst_pool.clone()
    src = torch.tensor([5, 0], dtype=torch.int32, device=device)
    dst = torch.tensor([0, 3], dtype=torch.int32, device=device)

    copy_blocks(src_pool, dst_pool, src, dst, chunk=512)

    expected[dst.long()] = src_pool[src.long()]
    assert torch.equal(dst_pool, expected)


def test_copy_nothing_is_a_no_op(device):
    pool = _pool(3, device)
    before = pool.clone()
    empty = torch.empty(0, dtype=torch.long, device=device)

    copy_blocks(pool, pool, empty, empty)

    assert torch.equal(pool, before)


def test_copy_rejects_non_contiguous_blocks(device):
    pool = _pool(4, device)
    with pytest.raises(AssertionError, match="not contiguous"):
        # All layers' K without V: each block's span has holes.
        copy_blocks(pool[:, :, 0], pool[:, :, 0], torch.tensor([0]), torch.tensor([1]))


def test_copy_large_block_index_uses_int64_offsets(device, huge_pool):
    # Block 2 starts 2^31 elements into the storage: block_id * stride overflows int32.
    huge_pool[2].normal_()
    src = torch.tensor([2], dtype=torch.int32, device=device)
    dst = torch.tensor([0], dtype=torch.int32, device=device)

    copy_blocks(huge_pool, huge_pool, src, dst)

    assert torch.equal(huge_pool[0], huge_pool[2])
    huge_pool[0].normal_()
    copy_blocks(huge_pool, huge_pool, dst, src)  # and back: a store at the far block
    assert torch.equal(huge_pool[2], huge_pool[0])


def test_swap_out_and_in_round_trip(device):
    device_pool = _pool(8, device)
    host_pool = torch.zeros(5, *device_pool.shape[1:])
    original = device_pool.clone()

    swap_blocks(device_pool, host_pool, [(6, 0), (2, 4)])  # swap out
    assert torch.equal(host_pool[0], original[6].cpu())
    assert torch.equal(host_pool[4], original[2].cpu())
    assert torch.equal(host_pool[1:4], torch.zeros_like(host_pool[1:4]))

    device_pool[[2, 6]] = 0
    swap_blocks(host_pool, device_pool, [(0, 1), (4, 5)])  # swap in, to other blocks
    assert torch.equal(device_pool[1], original[6])
    assert torch.equal(device_pool[5], original[2])
