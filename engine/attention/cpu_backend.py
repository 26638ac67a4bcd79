"""The CPU attention backend on the compiled kernels of ``kernels/cpu`` (docs/kernels.md).

Per layer, two calls, no per-request Python loop and no copy of the context:

1. ``store_kv`` writes the step's new K/V rows into the layer's cache through ``slot_mapping``;
2. ``paged_attention`` attends every row of the flat batch (decode rows, prefill chunks with
   or without cached context) over its request's blocks, read in place, GQA-aware, with an
   online softmax over blocks; threaded over (request, KV head, query tile).

``meta.sliding_window`` (set per layer) limits a row to its last ``window`` positions.

``forward_rows`` stores every row's K/V the same way but attends only some rows (a step's
last layer for its sampled rows: ``engine.attention.output_rows``).
"""

from __future__ import annotations

from typing import Any

import torch

from engine.attention.backend import AttentionMetadata
from engine.attention.output_rows import OutputRows


class CpuAttentionBackend:
    """AttentionBackend on ``torch.ops.pdserve_cpu`` (see ``kernels.cpu.load``)."""

    name = "cpu"

    def __init__(self, ops: Any) -> None:
        self._ops = ops
        self._covered = 0  # rows covered by query_start_loc this step (the rest is padding)

    def prepare(self, meta: AttentionMetadata, block_size: int) -> None:
        self._covered = sum(meta.query_lens_cpu)

    @property
    def covered(self) -> int:
        """Rows of this step's flat batch that its requests own (the rest is padding)."""
        return self._covered

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
        self._ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype)
        if self._covered < q.shape[0]:
            out[self._covered :].zero_()
        self._attend(out, q, k_cache, v_cache, meta, scale)
        return out

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
        self._ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype)
        self._attend(out, q, k_cache, v_cache, rows.meta, scale)
        return out

    def _attend(
        self,
        out: torch.Tensor,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> None:
        """``out`` = every request of ``meta`` attending over the caches (nothing without one)."""
        if meta.num_seqs == 0:
            return
        self._ops.paged_attention(
            out,
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            meta.sliding_window or 0,
        )
