"""The rows of a step whose final hidden states the step needs, and their attention metadata.

A step samples one token per sampling request, from its last row; every other row (a prefill
chunk's earlier tokens, a chunk that does not finish its prompt) feeds the later layers only
through the K/V it leaves in the cache. So past the last layer's K/V only the sampled rows
matter: the last layer computes K and V for every row, and q, attention, o and the MLP for
those rows alone (the model's ``forward(out_rows=...)``). On a prefill step of ~2,000 rows that
is ~94% of the last layer's GEMMs and nearly all its attention.

Each of those rows attends alone, as a one-query request over its request's cache (the step's
K/V already written): ``meta`` describes them that way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from engine.attention.backend import AttentionMetadata


@dataclass(frozen=True)
class OutputRows:
    rows: torch.Tensor  # [n] int64, ascending rows of the step's flat batch
    meta: AttentionMetadata  # n one-query requests: row i at position seq_lens[i] - 1

    @classmethod
    def last_rows(cls, meta: AttentionMetadata, seqs: Sequence[int]) -> OutputRows:
        """The last rows of requests ``seqs`` (ascending indices into ``meta``'s requests)."""
        ends: list[int] = []
        end = 0
        for n in meta.query_lens_cpu:
            end += n
            ends.append(end - 1)
        rows = [ends[s] for s in seqs]
        seq_lens = tuple(meta.seq_lens_cpu[s] for s in seqs)
        dev = meta.query_start_loc.device
        picked = torch.tensor(list(seqs), dtype=torch.long, device=dev)
        rows_t = torch.tensor(rows, dtype=torch.long, device=dev)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        n = len(rows)
        return cls(
            rows=rows_t,
            meta=AttentionMetadata(
                num_tokens=n,
                num_seqs=n,
                query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=dev),
                query_lens=torch.ones(n, dtype=torch.int32, device=dev),
                context_lens=lens - 1,
                seq_lens=lens,
                block_tables=meta.block_tables.index_select(0, picked),
                slot_mapping=meta.slot_mapping.index_select(0, rows_t),
                max_query_len=1,
                max_seq_len=max(seq_lens, default=0),
                query_lens_cpu=(1,) * n,
                seq_lens_cpu=seq_lens,
                sliding_window=meta.sliding_window,
            ),
        )

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def covers(self, num_tokens: int) -> bool:
        """Whether these are all ``num_tokens`` rows of the step (a decode step's case)."""
        return len(self) == num_tokens

    def with_window(self, sliding_window: int | None) -> OutputRows:
        """The same rows for a layer with this sliding window."""
        return dataclasses.replace(
            self, meta=dataclasses.replace(self.meta, sliding_window=sliding_window)
        )


@runtime_checkable
class RowsAttentionBackend(Protocol):
    """A backend that can store every row's K/V but attend only some rows (the cpu, torch and
    Triton backends). With any other the model runs the last layer for every row and then
    keeps the rows it needs."""

    def forward_rows(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        rows: OutputRows,
        scale: float,
    ) -> torch.Tensor: ...
