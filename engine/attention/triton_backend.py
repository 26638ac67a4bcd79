"""The Triton attention backend: KV store, then paged attention, with the kernels in ``kernels/``.

Per layer, ``forward`` makes two launches:

1. ``store_kv`` writes the step's new K/V rows into the layer's cache through ``slot_mapping``;
2. attention over the cache:
   - a pure-decode step (one new token per request) runs ``paged_decode_attention``, split-KV
     when there are too few (request, KV head) pairs to fill the GPU and contexts are long;
   - any other step (prefill chunks, alone or mixed with decodes) runs the variable-length
     ``paged_prefill_attention`` over the whole flat batch in one launch.

``meta.sliding_window`` (set per layer) limits both to the last ``window`` positions.

``forward_rows`` stores every row's K/V the same way but attends only some rows, each a
one-query request run by ``paged_decode_attention`` (a step's last layer for its sampled rows:
``engine.attention.output_rows``).

It runs on CUDA tensors, or on CPU tensors in Triton's interpreter (slow; for tests on tiny
models), which needs ``TRITON_INTERPRET=1`` before ``triton`` is first imported: ``kernels``
sets it itself on a host without CUDA when it is the first to import triton.
"""

from __future__ import annotations

import torch

from engine.attention.backend import AttentionMetadata
from engine.attention.output_rows import OutputRows
from kernels.kv_store import store_kv
from kernels.paged_decode_attention import default_num_splits, paged_decode_attention
from kernels.paged_prefill_attention import paged_prefill_attention


class TritonAttentionBackend:
    """AttentionBackend on Triton kernels. Metadata tensors must be on the q/k/v device."""

    name = "triton"

    def __init__(self, num_sms: int | None = None) -> None:
        # Split-KV heuristic input; read lazily from the device on the first decode step.
        self._num_sms = num_sms
        self._block_size: int | None = None

    def prepare(self, meta: AttentionMetadata, block_size: int) -> None:
        """Record the block size; every plan the kernels need is read from ``meta`` per layer."""
        self._block_size = block_size

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] (strided view)
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] (strided view)
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Write ``k``/``v`` into the caches, return attention output ``[num_tokens, heads, dim]``.

        Rows not covered by ``query_start_loc`` (padding past the last request) come back zero.
        """
        if self._block_size is not None:
            assert k_cache.shape[1] == self._block_size, "cache block size differs from prepare()"
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.num_seqs == 0:
            return torch.zeros_like(q)
        window = meta.sliding_window
        if meta.is_pure_decode and meta.num_tokens == meta.num_seqs:
            return self._decode(q, k_cache, v_cache, meta, scale)
        # 64-row query tiles for real chunks; 16 when every request brings only a few tokens
        # (rows = new tokens x query heads per KV head), so decode rows waste less of a tile.
        queries_per_kv = q.shape[1] // k_cache.shape[2]
        block_m = 16 if meta.max_query_len * queries_per_kv <= 16 else 64
        return paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            block_m=block_m,
            sliding_window=window,
        )

    def forward_rows(
        self,
        q: torch.Tensor,  # [len(rows), num_heads, head_dim]: the rows' queries
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]: every row's
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        rows: OutputRows,
        scale: float,
    ) -> torch.Tensor:
        """Write every row's ``k``/``v`` into the caches (``meta``), then return the attention
        output ``[len(rows), heads, dim]`` of ``rows`` alone, each a one-query request."""
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return self._decode(q, k_cache, v_cache, rows.meta, scale)  # no rows: an empty launch

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Every request of ``meta`` (one query each, at its last position) over the caches,
        split-KV when there are too few (request, KV head) pairs to fill the GPU."""
        window = meta.sliding_window
        visible = meta.max_seq_len if window is None else min(meta.max_seq_len, window)
        num_splits = default_num_splits(meta.num_seqs, k_cache.shape[2], visible, self._sm_count(q))
        return paged_decode_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.seq_lens,
            scale,
            num_splits,
            sliding_window=window,
        )

    def _sm_count(self, q: torch.Tensor) -> int:
        if self._num_sms is None:
            if q.device.type == "cuda":
                props = torch.cuda.get_device_properties(q.device)
                self._num_sms = props.multi_processor_count
            else:
                self._num_sms = 132
        return self._num_sms
