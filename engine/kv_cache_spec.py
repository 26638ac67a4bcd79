"""The shape of the paged KV pool, shared by the engine, the kernels and the KV transfer.

Layout (block-major): one tensor

    kv_pool[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]
             │           │          │  └ token slot inside the block
             │           │          └ 0 = K, 1 = V
             │           └ decoder layer
             └ physical block id

so one block (all layers' K and V for ``block_size`` tokens) is a single contiguous span of
``bytes_per_block`` bytes: a transfer or a swap of a block is one copy, and a receiver can write
straight into the pool. A layer's K cache is the strided view ``kv_pool[:, layer, 0]`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``.

A token at position ``p`` of a request lives in block ``block_table[p // block_size]`` at slot
``p % block_size``; its flat slot index is ``block_id * block_size + p % block_size``
(the ``slot_mapping``).

This module imports no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

KV_LAYOUT = "block_major_v1"

_DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class KVCacheSpec:
    """Everything two processes must agree on to exchange KV blocks."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str  # "float32" | "bfloat16" | "float16"
    model_id: str = ""  # name or content hash of the model the cache belongs to

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPE_SIZES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPE_SIZES)}, got {self.dtype!r}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def dtype_size(self) -> int:
        return _DTYPE_SIZES[self.dtype]

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block: ``(num_layers, 2, block_size, num_kv_heads, head_dim)``."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def elements_per_block(self) -> int:
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim

    @property
    def bytes_per_block(self) -> int:
        return self.elements_per_block * self.dtype_size

    def pool_shape(self, num_blocks: int) -> tuple[int, int, int, int, int, int]:
        """Shape of a pool holding ``num_blocks`` blocks."""
        return (num_blocks, *self.block_shape)

    def fingerprint(self) -> str:
        """A short stable digest of the spec and the layout; equal iff blocks are exchangeable."""
        payload = json.dumps({**asdict(self), "layout": KV_LAYOUT}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def segment_runs(src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> list[int]:
    """Split a copy of blocks between two pools (a KV push, a swap) into runs of blocks that
    are consecutive in *both* pools; returns the run lengths. Each run is one contiguous span
    on either side (one message on UCX, one slice copy in a swap).

        src  7 8 9 3 4      dst  20 21 5 6 7   ->  [2, 1, 2]
    """
    runs: list[int] = []
    for k in range(len(src_block_ids)):
        if (
            k > 0
            and src_block_ids[k] == src_block_ids[k - 1] + 1
            and dst_block_ids[k] == dst_block_ids[k - 1] + 1
        ):
            runs[-1] += 1
        else:
            runs.append(1)
    return runs
