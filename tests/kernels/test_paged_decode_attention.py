import pytest
import torch

from kernels.paged_decode_attention import default_num_splits, paged_decode_attention
from kernels.reference import paged_attention_reference


def _decode_case(num_heads, num_kv_heads, head_dim, block_size, seq_lens, dtype, device):
    num_seqs = len(seq_lens)
    max_blocks = max(-(-s // block_size) for s in seq_lens)
    num_blocks = num_seqs * max_blocks + 3
    pool = torch.randn(num_blocks, 1, 2, block_size, num_kv_heads, head_dim, device=device)
    pool = pool.to(dtype)
    # Each sequence gets distinct, shuffled physical blocks; the table tail is 0-padded.
    perm = torch.randperm(num_blocks, device=device)
    block_tables = torch.zeros(num_seqs, max_blocks + 2, dtype=torch.int32, device=device)
    for i, s in enumerate(seq_lens):
        n = -(-s // block_size)
        block_tables[i, :n] = perm[i * max_blocks : i * max_blocks + n]
    q = torch.randn(num_seqs, num_heads, head_dim, device=device).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, pool[:, 0, 0], pool[:, 0, 1], block_tables, lens


def _reference(q, k_cache, v_cache, block_tables, seq_lens, scale):
    query_start_loc = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_attention_reference(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale
    )


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "num_splits"),
    [
        (4, 4, 64, 16, 1),  # MHA
        (8, 2, 128, 16, 1),  # GQA
        (8, 1, 64, 32, 1),  # MQA
        (6, 2, 32, 32, 1),  # group of 3 (not a power of 2)
        (4, 2, 48, 16, 1),  # head_dim not a power of 2
        (4, 2, 16, 16, 1),  # the engine's tiny test models (hidden 64, 4 heads)
        (8, 2, 128, 32, 3),  # split-KV
        (4, 1, 64, 16, 4),  # split-KV, MQA
        (4, 4, 32, 16, 8),  # more splits than a short sequence needs: empty splits
    ],
)
def test_paged_decode_matches_reference(
    num_heads, num_kv_heads, head_dim, block_size, num_splits, device
):
    seq_lens = [1, 37, 200]
    q, k_cache, v_cache, block_tables, lens = _decode_case(
        num_heads, num_kv_heads, head_dim, block_size, seq_lens, torch.float32, device
    )
    scale = head_dim**-0.5

    out = paged_decode_attention(
        q, k_cache, v_cache, block_tables, lens, scale, num_splits=num_splits
    )

    expected = _reference(q, k_cache, v_cache, block_tables, lens, scale)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_paged_decode_half_precision(num_splits, device):
    q, k_cache, v_cache, block_tables, lens = _decode_case(
        8, 2, 64, 16, [5, 130], torch.float16, device
    )

    out = paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.125, num_splits)

    assert out.dtype == torch.float16
    expected = _reference(q, k_cache, v_cache, block_tables, lens, 0.125)
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)


def test_paged_decode_large_block_index_uses_int64_offsets(device, huge_pool):
    # Block 2 starts 2^31 elements into the storage: block_id * stride overflows int32.
    k_cache, v_cache = huge_pool[:, 0, 0], huge_pool[:, 0, 1]
    k_cache.normal_()
    v_cache.normal_()
    q = torch.randn(2, 4, 32, device=device).half()
    block_tables = torch.tensor([[2, 0], [0, 2]], dtype=torch.int32, device=device)
    lens = torch.tensor([20, 32], dtype=torch.int32, device=device)

    for num_splits in (1, 2):
        out = paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.2, num_splits)
        expected = _reference(q, k_cache, v_cache, block_tables, lens, 0.2)
        torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)


def test_paged_decode_writes_into_given_output(device):
    q, k_cache, v_cache, block_tables, lens = _decode_case(
        4, 2, 64, 16, [3, 9], torch.float32, device
    )
    out = torch.full((2, 4, 64), float("nan"), device=device)

    result = paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.125, out=out)

    assert result is out
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, block_tables, lens, 0.125))


def test_default_num_splits():
    assert default_num_splits(256, 8, 32768) == 1  # 2048 programs fill 132 SMs already
    assert default_num_splits(1, 8, 512) == 1  # short context
    assert default_num_splits(1, 8, 32768) == 32  # 8 programs, long context: capped
    assert default_num_splits(4, 8, 4096) == 8  # bounded by 4096 / 512 tokens per split
    assert default_num_splits(16, 8, 8192) == 5  # ceil(528 / 128) programs per pair


@pytest.mark.parametrize(("window", "num_splits"), [(1, 1), (24, 1), (50, 3), (500, 2)])
def test_paged_decode_sliding_window(window, num_splits, device):
    # seq_lens around the window: shorter than it, equal, much longer.
    q, k_cache, v_cache, block_tables, lens = _decode_case(
        4, 2, 32, 16, [1, 24, 50, 130], torch.float32, device
    )

    out = paged_decode_attention(
        q, k_cache, v_cache, block_tables, lens, 0.2, num_splits, sliding_window=window
    )

    query_start_loc = torch.arange(5, dtype=torch.int32, device=device)
    expected = paged_attention_reference(
        q, k_cache, v_cache, block_tables, query_start_loc, lens, 0.2, sliding_window=window
    )
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
