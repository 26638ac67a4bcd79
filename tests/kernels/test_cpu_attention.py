"""The compiled CPU paged attention and KV store against the plain-torch references."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import paged_attention_reference, store_kv_reference
from tests.kernels.cpu_ops import cpu_ops

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _case(heads, kv_heads, dim, block_size, query_lens, context_lens, dtype, layers=3):
    """Block-major pool (layer 1's strided views), shuffled blocks, padded block tables."""
    seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    width = max(-(-s // block_size) for s in seq_lens) + 1  # one padding column
    num_blocks = len(seq_lens) * width + 3
    pool = torch.randn(num_blocks, layers, 2, block_size, kv_heads, dim).to(dtype)
    perm = torch.randperm(num_blocks)
    tables = torch.full((len(seq_lens), width), 7, dtype=torch.int32)
    for i, s in enumerate(seq_lens):
        n = -(-s // block_size)
        tables[i, :n] = perm[i * width : i * width + n]
    qsl = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(query_lens).cumsum(0)
    tokens = int(qsl[-1])
    # q as the engine has it: a strided view of the fused qkv projection's output.
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(dtype)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return q, pool[:, 1, 0], pool[:, 1, 1], tables, qsl, lens


def _check(case, scale, window, dtype, tolerance=None):
    ops = cpu_ops()
    q, k_cache, v_cache, tables, qsl, lens = case
    out = torch.full(q.shape, float("nan"), dtype=dtype)
    ops.paged_attention(out, q, k_cache, v_cache, tables, qsl, lens, scale, window or 0)
    ref = paged_attention_reference(q, k_cache, v_cache, tables, qsl, lens, scale, window)
    tol = tolerance or TOLERANCE[dtype]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [
        (4, 4, 64),  # MHA
        (9, 3, 64),  # GQA, group of 3 (the benchmark model)
        (8, 2, 128),  # GQA
        (8, 1, 32),  # MQA
        (64, 1, 32),  # MQA with more query heads than a work item's rows
        (4, 2, 48),  # head_dim not a power of two
        (6, 3, 20),  # head_dim not a multiple of any vector width
        (4, 2, 16),  # the engine's tiny test models
    ],
)
@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_rows(heads, kv_heads, dim, block_size):
    context = [0, 1, 15, 16, 17, 63, 200, 33]  # ragged, on and off block boundaries
    case = _case(heads, kv_heads, dim, block_size, [1] * len(context), context, torch.float32)
    _check(case, dim**-0.5, None, torch.float32)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size"),
    [(9, 3, 64, 16), (8, 2, 128, 32), (4, 1, 64, 16), (4, 4, 32, 8)],
)
def test_mixed_prefill_and_decode(heads, kv_heads, dim, block_size):
    # chunk with context, fresh prompt, decodes, a chunk spanning many query tiles
    query_lens = [7, 1, 21, 1, 3, 70]
    context_lens = [40, 70, 0, 0, 16, 5]
    case = _case(heads, kv_heads, dim, block_size, query_lens, context_lens, torch.float32)
    _check(case, 0.3, None, torch.float32)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128), (4, 2, 48), (6, 3, 20), (12, 4, 16)]
)
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("threads", [1, 2])
def test_many_short_rows_one_item_per_request(heads, kv_heads, dim, window, threads):
    # Enough decode-sized requests (>= 4 per thread) that each becomes one item over all KV
    # heads, read key-major with the next block prefetched: 1-3 new tokens (rows up to 32),
    # contexts ragged around block edges, some spanning many blocks.
    query_lens = [1, 1, 2, 1, 3, 1, 1, 2, 1, 1, 1, 3][: 32 // heads * 4] * 2
    context_lens = [0, 15, 16, 17, 31, 100, 5, 48, 63, 64, 300, 2] * 2
    context_lens = context_lens[: len(query_lens)]
    query_lens = [min(n, 32 // heads) for n in query_lens]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case = _case(heads, kv_heads, dim, 16, query_lens, context_lens, torch.float32)
        _check(case, dim**-0.5, window, torch.float32)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 2, 48), (6, 3, 20)])
@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("requests", [2, 16])
def test_decode_rows_over_key_chunks(heads, kv_heads, dim, window, requests):
    # Decode items walk their keys in chunks of 256 (kChunkKeys) with rows prefetched 16 keys
    # ahead across chunk edges: contexts on, around and well past those edges, a window whose
    # first key is mid-block, and (2 requests) items cut into split-KV parts.
    edges = [255, 256, 257, 511, 513, 700, 1000, 1023]
    context_lens = [1000, 530] if requests == 2 else (edges * 2)[:requests]
    case = _case(heads, kv_heads, dim, 16, [1] * requests, context_lens, torch.float32, layers=2)
    _check(case, dim**-0.5, window, torch.float32)


@pytest.mark.parametrize("window", [1, 5, 16, 24, 100])
@pytest.mark.parametrize("block_size", [16, 32])
def test_sliding_window(window, block_size):
    query_lens = [1, 1, 9, 30, 1]
    context_lens = [3, 90, 40, 0, 16]
    case = _case(8, 2, 32, block_size, query_lens, context_lens, torch.float32)
    _check(case, 32**-0.5, window, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype):
    case = _case(8, 2, 64, 16, [1, 5, 12], [50, 20, 0], dtype)
    _check(case, 0.125, None, dtype)


def test_extreme_scores_stay_finite():
    # Logits in the thousands: the online softmax must rescale, not overflow. (Scores this
    # large carry ~1e-7 relative error into exponents of ~1e3, hence the looser tolerance.)
    q, k_cache, v_cache, tables, qsl, lens = _case(4, 2, 64, 16, [1, 4], [90, 30], torch.float32)
    _check((q * 40, k_cache, v_cache, tables, qsl, lens), 1.0, None, torch.float32, 2e-3)


def test_rejects_bad_arguments():
    ops = cpu_ops()
    q, k_cache, v_cache, tables, qsl, lens = _case(4, 2, 32, 16, [1, 2], [5, 3], torch.float32)
    out = torch.empty(q.shape)
    with pytest.raises(RuntimeError, match="int32"):
        ops.paged_attention(out, q, k_cache, v_cache, tables.long(), qsl, lens, 1.0, 0)
    with pytest.raises(RuntimeError, match="dtype"):
        ops.paged_attention(out.double(), q, k_cache, v_cache, tables, qsl, lens, 1.0, 0)
    with pytest.raises(RuntimeError, match="head"):
        ops.paged_attention(out[:, :3], q[:, :3], k_cache, v_cache, tables, qsl, lens, 1.0, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_store_kv_writes_only_its_slots(dtype):
    ops = cpu_ops()
    pool = torch.randn(6, 2, 2, 16, 3, 32).to(dtype)
    expected = pool.clone()
    kv = torch.randn(5, 2, 3, 32).to(dtype)
    k, v = kv[:, 0], kv[:, 1]  # strided rows
    slots = torch.tensor([17, -1, 80, 3, 95], dtype=torch.long)
    ops.store_kv(k, v, pool[:, 1, 0], pool[:, 1, 1], slots)
    store_kv_reference(k, v, expected[:, 1, 0], expected[:, 1, 1], slots)
    assert torch.equal(pool, expected)


def test_store_kv_many_tokens_threaded():
    ops = cpu_ops()
    pool = torch.zeros(40, 1, 2, 16, 2, 64)
    k, v = torch.randn(600, 2, 64), torch.randn(600, 2, 64)
    slots = torch.randperm(640)[:600]
    expected = pool.clone()
    ops.store_kv(k, v, pool[:, 0, 0], pool[:, 0, 1], slots)
    store_kv_reference(k, v, expected[:, 0, 0], expected[:, 0, 1], slots)
    assert torch.equal(pool, expected)


@pytest.mark.parametrize("threads", [1, 2, 8])
@pytest.mark.parametrize("window", [None, 700])
def test_split_kv_few_long_requests(threads, window):
    """Fewer work items than twice the threads: long key ranges are split into parts whose
    partial softmax results are merged (flash-decoding), for decodes and a chunk."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case = _case(8, 2, 64, 16, [1, 3], [3000, 1400], torch.float32)
        _check(case, 0.125, window, torch.float32)
        case = _case(4, 4, 32, 32, [1], [2100], torch.float32)
        _check(case, 0.2, window, torch.float32)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("window", [None, 100])
def test_split_kv_small_batch_of_decodes(threads, window):
    """A few decode rows alone run as all-heads items: one to three (fewer than twice the
    threads) cut along their keys from 64 keys a part, short contexts included; five whole."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for context in ([300], [130, 70, 260], [5, 64], [127], [400, 3, 90, 250, 33]):
            case = _case(9, 3, 64, 16, [1] * len(context), context, torch.float32)
            _check(case, 0.125, window, torch.float32)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [
        (9, 3, 64),  # the benchmark model: 21-token tiles of 63 rows
        (4, 4, 64),  # MHA: one head a tile
        (8, 2, 128),
        (8, 1, 32),  # MQA: a group of 8
        (64, 1, 32),  # a group wider than kMaxRows: slices of 32 heads, two tokens a tile
        (8, 2, 80),  # head size a multiple of the vector but not of four vectors
        (6, 3, 20),  # not a multiple of any vector: the per-row path
    ],
)
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("window", [None, 37])
def test_prefill_tiles(heads, kv_heads, dim, block_size, window):
    """Prefill chunks run as row-vectorised tiles: chunks of every length around the tile size,
    from position 0 and after a context, and one decode row beside them."""
    query_lens = [100, 64, 21, 22, 11, 257, 1]
    context_lens = [0, 45, 3, 0, 130, 200, 90]
    case = _case(heads, kv_heads, dim, block_size, query_lens, context_lens, torch.float32)
    _check(case, dim**-0.5, window, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_tiles_half_precision_and_split(dtype, threads):
    """A half-precision pool (each block converted to float as read), and one long chunk alone
    on the threads, whose tiles' key ranges are split and merged."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check(_case(8, 2, 64, 16, [40, 3], [300, 7], dtype), 0.125, None, dtype)
        _check(_case(2, 1, 64, 16, [30], [1500], torch.float32), 0.125, None, torch.float32)
        _check(_case(2, 1, 64, 16, [30], [1500], torch.float32), 0.125, 600, torch.float32)
    finally:
        torch.set_num_threads(before)
