"""The attention backend interface and the per-step metadata every backend reads.

A step's batch is flat: the new tokens of every scheduled request, concatenated in schedule
order. Request ``i`` owns rows ``query_start_loc[i] : query_start_loc[i + 1]`` of ``q``/``k``/``v``.

    request i:   | already in cache (context_lens[i]) | new this step (query_lens[i]) |
    positions:   0 ........................ context_lens[i]-1 .......... seq_lens[i]-1

A decode is a request with ``query_lens[i] == 1``; a prefill chunk has more. New token ``j`` of
request ``i`` sits at position ``context_lens[i] + j`` and attends causally to positions
``0 .. context_lens[i] + j`` (its own K/V included, written to the pool first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step tensors shared by all layers. Built once per step by the model runner."""

    num_tokens: int  # rows of the flat batch
    num_seqs: int
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, cumulative query lengths
    query_lens: torch.Tensor  # [num_seqs] int32
    context_lens: torch.Tensor  # [num_seqs] int32, tokens already in the cache
    seq_lens: torch.Tensor  # [num_seqs] int32, context_lens + query_lens
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, flat pool slot of each new token; -1 = skip
    max_query_len: int
    max_seq_len: int
    # Host-side copies (plain ints) so backends can plan without a device sync.
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]
    # Sliding-window attention (Mistral): a query at position p sees keys in (p - window, p].
    # None = full causal attention. Set per layer via dataclasses.replace.
    sliding_window: int | None = None

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend(Protocol):
    """Writes the step's new K/V into one layer's cache, then attends over the cache."""

    name: str

    def prepare(self, meta: AttentionMetadata, block_size: int) -> None:
        """Called once per step before any layer; may precompute per-step plans (idempotent)."""
        ...

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
        """Return attention output ``[num_tokens, num_heads, head_dim]``, causal per request."""
        ...
