import dataclasses

import pytest
import torch

import engine.attention.triton_backend as triton_backend
from engine.attention.backend import AttentionMetadata
from engine.attention.triton_backend import TritonAttentionBackend
from engine.kv_cache_spec import KVCacheSpec
from kernels.paged_decode_attention import paged_decode_attention
from kernels.reference import paged_attention_reference, store_kv_reference

SPEC = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=32, block_size=16, dtype="float32")
NUM_HEADS = 4


def _metadata(block_tables, context_lens, query_lens, device, num_padding_rows=0):
    """Step metadata as the model runner builds it; padding rows get slot -1."""
    block_size = SPEC.block_size
    seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    slots = []
    for table, context, new in zip(block_tables, context_lens, query_lens, strict=True):
        slots += [
            table[p // block_size] * block_size + p % block_size
            for p in range(context, context + new)
        ]
    slots += [-1] * num_padding_rows
    width = max(len(t) for t in block_tables)
    tables = [t + [0] * (width - len(t)) for t in block_tables]
    query_start_loc = [0]
    for n in query_lens:
        query_start_loc.append(query_start_loc[-1] + n)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    return AttentionMetadata(
        num_tokens=len(slots),
        num_seqs=len(seq_lens),
        query_start_loc=i32(query_start_loc),
        query_lens=i32(query_lens),
        context_lens=i32(context_lens),
        seq_lens=i32(seq_lens),
        block_tables=i32(tables),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=tuple(query_lens),
        seq_lens_cpu=tuple(seq_lens),
    )


def _run_step(backend, pool, expected_pool, meta, device, windows=(None, None)):
    """Both layers through the backend and through the torch reference; compare.

    ``windows``: each layer's sliding window, set on the metadata as the model runner does.
    """
    backend.prepare(meta, SPEC.block_size)
    scale = SPEC.head_dim**-0.5
    step_meta = meta
    for layer in range(SPEC.num_layers):
        meta = dataclasses.replace(step_meta, sliding_window=windows[layer])
        q = torch.randn(meta.num_tokens, NUM_HEADS, SPEC.head_dim, device=device)
        k = torch.randn(meta.num_tokens, SPEC.num_kv_heads, SPEC.head_dim, device=device)
        v = torch.randn(meta.num_tokens, SPEC.num_kv_heads, SPEC.head_dim, device=device)

        out = backend.forward(q, k, v, pool[:, layer, 0], pool[:, layer, 1], meta, scale)

        k_ref, v_ref = expected_pool[:, layer, 0], expected_pool[:, layer, 1]
        store_kv_reference(k, v, k_ref, v_ref, meta.slot_mapping)
        expected = paged_attention_reference(
            q,
            k_ref,
            v_ref,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            sliding_window=meta.sliding_window,
        )
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
        assert torch.equal(pool, expected_pool)


@pytest.mark.parametrize("windows", [(None, None), (None, 20)])
def test_mixed_steps_then_pure_decode(windows, device):
    pool = torch.zeros(SPEC.pool_shape(160), device=device)
    expected_pool = pool.clone()
    backend = TritonAttentionBackend()
    assert backend.name == "triton"
    # Request 0: long prompt prefilled in chunks; 1: short prompt; 2: already decoding.
    tables = [list(range(1, 80)), [90, 91], [100, 101, 102]]

    # Step 1: first chunk of 0, whole prompt of 1, nothing cached yet for 2 (prompt of 40).
    meta = _metadata(tables, [0, 0, 0], [24, 9, 40], device)
    _run_step(backend, pool, expected_pool, meta, device, windows)
    # Step 2: a chunk of 0 over its 24 cached tokens, decode of 1 and 2, two padding rows.
    meta = _metadata(tables, [24, 9, 40], [30, 1, 1], device, num_padding_rows=2)
    _run_step(backend, pool, expected_pool, meta, device, windows)
    # Step 3: pure decode.
    meta = _metadata(tables, [54, 10, 41], [1, 1, 1], device)
    _run_step(backend, pool, expected_pool, meta, device, windows)


def test_decodes_with_padding_rows_take_the_unified_kernel(device):
    # Pure decode plus padding rows (a padded batch): small query tiles of the prefill kernel.
    pool = torch.randn(SPEC.pool_shape(20), device=device)
    expected_pool = pool.clone()
    tables = [[3, 4, 5], [7], [11, 12]]
    meta = _metadata(tables, [40, 2, 17], [1, 1, 1], device, num_padding_rows=3)

    _run_step(TritonAttentionBackend(), pool, expected_pool, meta, device, windows=(None, 8))


def test_pure_decode_long_context_uses_split_kv(device, monkeypatch):
    # 2 sequences x 2 KV heads leave the GPU mostly idle: split-KV kicks in for 1100 tokens.
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[6])  # num_splits
        return paged_decode_attention(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "paged_decode_attention", spy)
    pool = torch.randn(SPEC.pool_shape(150), device=device)
    expected_pool = pool.clone()
    backend = TritonAttentionBackend(num_sms=132)
    tables = [list(range(0, 70)), list(range(70, 140))]
    meta = _metadata(tables, [1099, 700], [1, 1], device)

    _run_step(backend, pool, expected_pool, meta, device)
    # Layer 1 with a 600-token window: splits by the visible length (600 // 512 = 1).
    _run_step(backend, pool, expected_pool, meta, device, windows=(None, 600))

    # Both layers: min(32, ceil(4 * 132 / 4), 1100 // 512); then 1100 and min(1100, 600).
    assert calls == [2, 2, 2, 1]
