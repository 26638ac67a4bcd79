import pytest
import torch

from kernels.kv_store import store_kv
from kernels.reference import store_kv_reference


def _pool(num_blocks, num_layers, block_size, num_kv_heads, head_dim, dtype, device):
    # The block-major pool of engine/kv_cache_spec.py; layer 1's K/V are strided views.
    shape = (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)
    return torch.randn(shape, device=device).to(dtype)


@pytest.mark.parametrize(
    ("num_kv_heads", "head_dim", "block_size", "dtype"),
    [
        (1, 64, 16, torch.float32),
        (2, 128, 32, torch.float32),
        (4, 32, 16, torch.float16),
        (3, 48, 32, torch.bfloat16),
    ],
)
def test_store_kv_matches_reference(num_kv_heads, head_dim, block_size, dtype, device):
    pool = _pool(8, 2, block_size, num_kv_heads, head_dim, dtype, device)
    expected = pool.clone()
    num_slots = 8 * block_size
    slots = torch.randperm(num_slots, device=device)[:11]
    slots[[2, 7]] = -1  # padding rows
    k = torch.randn(11, num_kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(11, num_kv_heads, head_dim, device=device).to(dtype)

    store_kv(k, v, pool[:, 1, 0], pool[:, 1, 1], slots)
    store_kv_reference(k, v, expected[:, 1, 0], expected[:, 1, 1], slots)

    assert torch.equal(pool, expected)  # also: nothing outside layer 1 / the slots was touched


def test_store_kv_int32_slots_and_strided_inputs(device):
    pool = _pool(4, 1, 16, 2, 64, torch.float32, device)
    expected = pool.clone()
    qkv = torch.randn(5, 3, 2, 64, device=device)  # k, v as strided slices of a fused tensor
    k, v = qkv[:, 1], qkv[:, 2]
    slots = torch.tensor([0, 17, 63, -1, 40], dtype=torch.int32, device=device)

    store_kv(k, v, pool[:, 0, 0], pool[:, 0, 1], slots)
    store_kv_reference(k, v, expected[:, 0, 0], expected[:, 0, 1], slots)

    assert torch.equal(pool, expected)


def test_store_kv_large_block_index_uses_int64_offsets(device, huge_pool):
    # Block 2 starts 2^31 elements into the storage: block_id * stride overflows int32.
    k_cache, v_cache = huge_pool[:, 0, 0], huge_pool[:, 0, 1]
    block_size = k_cache.shape[1]
    k = torch.randn(3, 2, 32, device=device).half()
    v = torch.randn(3, 2, 32, device=device).half()
    slots = [2 * block_size + 3, 5, 3 * block_size - 1]
    slot_mapping = torch.tensor(slots, dtype=torch.int32, device=device)

    store_kv(k, v, k_cache, v_cache, slot_mapping)

    assert torch.equal(k_cache[2, 3], k[0]) and torch.equal(v_cache[2, 3], v[0])
    assert torch.equal(k_cache[0, 5], k[1]) and torch.equal(v_cache[0, 5], v[1])
    assert torch.equal(k_cache[2, block_size - 1], k[2])


def test_store_kv_rejects_mismatched_shapes(device):
    pool = _pool(2, 1, 16, 2, 64, torch.float32, device)
    k = torch.randn(3, 2, 32, device=device)
    with pytest.raises(AssertionError):
        store_kv(k, k, pool[:, 0, 0], pool[:, 0, 1], torch.zeros(3, dtype=torch.long))


def test_store_kv_rejects_tensors_on_two_devices(device):
    pool = _pool(2, 1, 16, 2, 64, torch.float32, device)
    k = torch.randn(3, 2, 64, device=device)
    slots = torch.zeros(3, dtype=torch.long, device="meta")
    with pytest.raises(AssertionError, match="one kernel launch"):
        store_kv(k, k, pool[:, 0, 0], pool[:, 0, 1], slots)
