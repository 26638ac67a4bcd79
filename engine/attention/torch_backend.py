"""Attention over the paged pool with plain torch ops (the CPU path, and the reference).

Per step, ``prepare`` turns the metadata into a plan once (block ids per request, the store
indices, the masks); per layer, ``forward`` writes the new K/V rows into the pool with one
``index_put_`` and runs one fused SDPA per request over that request's gathered blocks.
The per-request loop is over requests, not tokens, and does no host/device synchronisation.
``forward_rows`` stores every row the same way but attends only some rows, each as a decode row
(a step's last layer for its sampled rows: ``engine.attention.output_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionMetadata
from engine.attention.output_rows import OutputRows


@dataclass
class _SeqPlan:
    q_start: int
    q_end: int
    q_len: int
    seq_len: int
    block_ids: torch.Tensor  # [num_blocks_of_this_request]


_Masks = list[tuple[torch.Tensor | None, bool]]  # per request: (bool mask [q, k], is_causal)


class TorchAttentionBackend:
    """Must be ``prepare``d once per step, before the first layer's ``forward``."""

    name = "torch"

    def __init__(self, single_threaded_decode: bool = True) -> None:
        self.single_threaded_decode = single_threaded_decode
        self._plan: list[_SeqPlan] = []
        self._masks: dict[int | None, _Masks] = {}
        self._store_blocks = torch.empty(0, dtype=torch.long)
        self._store_offsets = torch.empty(0, dtype=torch.long)
        self._store_rows: torch.Tensor | None = None

    def prepare(self, meta: AttentionMetadata, block_size: int) -> None:
        self._masks = {}
        slots = meta.slot_mapping
        valid = slots >= 0
        if bool(valid.all()):
            self._store_rows = None
            kept = slots
        else:
            self._store_rows = valid.nonzero().squeeze(1)
            kept = slots[self._store_rows]
        self._store_blocks = torch.div(kept, block_size, rounding_mode="floor")
        self._store_offsets = kept % block_size

        plan = []
        starts = [0]
        for n in meta.query_lens_cpu:
            starts.append(starts[-1] + n)
        block_tables = meta.block_tables.long()
        lens = zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)
        for i, (q_len, seq_len) in enumerate(lens):
            num_blocks = -(-seq_len // block_size)
            plan.append(
                _SeqPlan(starts[i], starts[i + 1], q_len, seq_len, block_tables[i, :num_blocks])
            )
        self._plan = plan

    def _masks_for(self, window: int | None, device: torch.device) -> _Masks:
        masks = self._masks.get(window)
        if masks is None:
            masks = []
            for p in self._plan:
                mask = self._mask(p.q_len, p.seq_len, window, device)
                masks.append((mask, mask is None and p.q_len > 1))
            self._masks[window] = masks
        return masks

    @staticmethod
    def _mask(
        q_len: int, seq_len: int, window: int | None, device: torch.device
    ) -> torch.Tensor | None:
        if q_len == 1:
            return None  # decode rows slice the window instead of masking
        ctx = seq_len - q_len
        if window is None or seq_len <= window:
            if q_len == 1 or ctx == 0:
                return None  # decode: sees everything; fresh prompt: plain causal
        q_pos = torch.arange(ctx, seq_len, device=device)[:, None]
        k_pos = torch.arange(seq_len, device=device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        return mask

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        masks = self._masks_for(meta.sliding_window, q.device)
        self._store(k, v, k_cache, v_cache)
        out = torch.empty_like(q)
        window = meta.sliding_window
        self._attend(q, k_cache, v_cache, out, masks, window, scale, decode=False)
        with self._decode_threads(q):
            self._attend(q, k_cache, v_cache, out, masks, window, scale, decode=True)
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
        """Write every row's K/V as ``forward`` does, then return the attention output of
        ``rows`` alone, each a one-query request attending as a decode row does
        (engine.attention.output_rows)."""
        self._store(k, v, k_cache, v_cache)
        out = torch.empty_like(q)
        rm = rows.meta
        block_size = k_cache.shape[1]
        tables = rm.block_tables.long()
        with self._decode_threads(q):
            for i, seq_len in enumerate(rm.seq_lens_cpu):
                blocks = tables[i, : -(-seq_len // block_size)]
                out[i] = self._attend_one(
                    q[i], k_cache, v_cache, blocks, seq_len, rm.sliding_window, scale
                )
        return out

    def _store(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> None:
        if self._store_rows is None:
            k_new, v_new = k, v
        else:
            k_new, v_new = k[self._store_rows], v[self._store_rows]
        k_cache[self._store_blocks, self._store_offsets] = k_new
        v_cache[self._store_blocks, self._store_offsets] = v_new

    @contextmanager
    def _decode_threads(self, q: torch.Tensor) -> Iterator[None]:
        """Decode rows are many tiny ops: with several intra-op threads each one pays a
        thread-pool barrier, which costs milliseconds on a busy machine. One thread is
        faster."""
        num_threads = torch.get_num_threads()
        if num_threads > 1 and not q.is_cuda and self.single_threaded_decode:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if torch.get_num_threads() != num_threads:
                torch.set_num_threads(num_threads)

    @staticmethod
    def _attend_one(
        q_row: torch.Tensor,  # [num_heads, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_ids: torch.Tensor,
        seq_len: int,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """One query at position seq_len - 1 over its request's blocks: two small GEMMs (they
        beat SDPA's per-call overhead for one query row)."""
        num_heads, head_dim = q_row.shape
        num_kv_heads = k_cache.shape[2]
        keys = k_cache.index_select(0, block_ids).view(-1, num_kv_heads, head_dim)
        values = v_cache.index_select(0, block_ids).view(-1, num_kv_heads, head_dim)
        start = max(0, seq_len - window) if window is not None else 0
        keys, values = keys[start:seq_len], values[start:seq_len]
        qh = q_row.view(num_kv_heads, num_heads // num_kv_heads, head_dim)
        scores = torch.matmul(qh, keys.permute(1, 2, 0)).mul_(scale)
        o = torch.matmul(scores.softmax(dim=-1), values.transpose(0, 1))
        return o.view(num_heads, head_dim)

    def _attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
        masks: _Masks,
        window: int | None,
        scale: float,
        decode: bool,
    ) -> None:
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = k_cache.shape[2]
        group = num_heads // num_kv_heads
        for p, (mask, is_causal) in zip(self._plan, masks, strict=True):
            if (p.q_len == 1) != decode:
                continue
            if p.q_len == 1:
                out[p.q_start] = self._attend_one(
                    q[p.q_start], k_cache, v_cache, p.block_ids, p.seq_len, window, scale
                )
                continue
            keys = k_cache.index_select(0, p.block_ids).view(-1, num_kv_heads, head_dim)
            values = v_cache.index_select(0, p.block_ids).view(-1, num_kv_heads, head_dim)
            o = F.scaled_dot_product_attention(
                q[p.q_start : p.q_end].transpose(0, 1).unsqueeze(0),
                keys[: p.seq_len].transpose(0, 1).unsqueeze(0),
                values[: p.seq_len].transpose(0, 1).unsqueeze(0),
                attn_mask=mask,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=group > 1,
            )
            out[p.q_start : p.q_end] = o[0].transpose(0, 1)
