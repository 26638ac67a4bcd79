"""Plain-torch references for the kernels: slow, obvious, used by tests and benchmarks.

Computed in float32 whatever the input dtype, one request at a time.
"""

from __future__ import annotations

import torch


def store_kv_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In place: ``cache[slot // block_size, slot % block_size] = row`` for slots >= 0."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache[slots // block_size, slots % block_size] = k[keep]
    v_cache[slots // block_size, slots % block_size] = v[keep]


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new rows over its cached positions, float32 output.

    Request ``i``'s rows ``query_start_loc[i]:query_start_loc[i+1]`` sit at the last positions
    of its ``seq_lens[i]`` tokens; row ``j`` sees positions ``0 .. seq_len - query_len + j``.
    With ``sliding_window`` W, row ``j`` sees only the last W of those positions.
    Rows past ``query_start_loc[-1]`` are zero.
    """
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        seq_len, query_len = int(seq_lens[i]), end - start
        if query_len == 0:
            continue
        pos = torch.arange(seq_len, device=q.device)
        blocks = block_tables[i].long()[pos // block_size]
        k = k_cache[blocks, pos % block_size].float().repeat_interleave(group, dim=1)
        v = v_cache[blocks, pos % block_size].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), k) * scale
        q_pos = seq_len - query_len + torch.arange(query_len, device=q.device)
        hidden = pos[None, :] > q_pos[:, None]
        if sliding_window is not None:
            hidden |= pos[None, :] <= q_pos[:, None] - sliding_window
        scores = scores.masked_fill(hidden[None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
    return out
