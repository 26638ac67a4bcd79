"""The memory behind the block ids: the device KV pool and the host (swap) pool.

Both use the block-major layout of ``engine.kv_cache_spec`` so a swap moves whole blocks: on a
GPU one gather, one transfer and one scatter each way; on the CPU, where both pools are host
memory, a direct copy of each run of consecutive blocks, with no staging buffer: a large
swap's staging buffer is fresh memory that pays a first touch per page every time (64 blocks of
SmolLM2-135M's shape, 47 MB, swapped out in 18-20 ms staged against 4-5 ms direct;
``benchmarks/swap_copy.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from engine.huge_pages import HUGE_PAGES_ENV, huge_page_aligned
from engine.kv_cache_spec import KVCacheSpec, segment_runs

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class KVCache:
    def __init__(
        self,
        spec: KVCacheSpec,
        num_blocks: int,
        num_host_blocks: int,
        device: torch.device,
        prefault: bool = False,
    ) -> None:
        """``prefault``: write the whole (CPU) pool now, so its memory is committed at start
        and no step pays a page's first touch (on huge pages, 2 MiB at a time)."""
        self.spec = spec
        dtype = _TORCH_DTYPES[spec.dtype]
        self.device = device
        shape = spec.pool_shape(num_blocks)
        if device.type == "cpu":
            # Fresh memory advised before anything touches it: a decode step's attention reads
            # blocks scattered over the whole pool, and on 4 KiB pages nearly each of those
            # reads is a TLB miss.
            flat, self.pool_huge_page_bytes = huge_page_aligned(
                math.prod(shape), dtype, HUGE_PAGES_ENV
            )
            self.pool = flat.view(shape)
        else:
            self.pool = torch.empty(shape, dtype=dtype, device=device)
            self.pool_huge_page_bytes = 0
        if prefault and device.type == "cpu":
            self.pool.zero_()
        # Left untouched until a swap writes it, on 4 KiB pages: a swap copies whole blocks in
        # order, so huge pages buy it nothing, and on a VM their first touch is what costs
        # (docs/benchmarks.md). A GPU's host pool is pinned, for full-speed transfers.
        pin = device.type == "cuda"
        self.host_pool = torch.empty(spec.pool_shape(num_host_blocks), dtype=dtype, pin_memory=pin)
        self.layer_caches: list[tuple[torch.Tensor, torch.Tensor]] = [
            (self.pool[:, layer, 0], self.pool[:, layer, 1]) for layer in range(spec.num_layers)
        ]

    @property
    def num_blocks(self) -> int:
        return self.pool.shape[0]

    @property
    def num_host_blocks(self) -> int:
        return self.host_pool.shape[0]

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy ``(device block, host block)`` pairs device -> host."""
        if not pairs:
            return
        if self.device.type == "cpu":
            _copy_runs(self.pool, self.host_pool, pairs)
            return
        dev = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=self.device)
        host = torch.tensor([p[1] for p in pairs], dtype=torch.long)
        self.host_pool.index_copy_(0, host, self.pool.index_select(0, dev).to("cpu"))

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy ``(host block, device block)`` pairs host -> device."""
        if not pairs:
            return
        if self.device.type == "cpu":
            _copy_runs(self.host_pool, self.pool, pairs)
            return
        host = torch.tensor([p[0] for p in pairs], dtype=torch.long)
        dev = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=self.device)
        self.pool.index_copy_(0, dev, self.host_pool.index_select(0, host).to(self.device))

    @staticmethod
    def blocks_for_bytes(spec: KVCacheSpec, num_bytes: int) -> int:
        return max(0, num_bytes // spec.bytes_per_block)


def _copy_runs(src: torch.Tensor, dst: torch.Tensor, pairs: Sequence[tuple[int, int]]) -> None:
    """``dst[d] = src[s]`` for each ``(s, d)`` pair, one slice copy per run of blocks that are
    consecutive in both pools (a victim's blocks often are)."""
    start = 0
    for n in segment_runs([s for s, _ in pairs], [d for _, d in pairs]):
        s, d = pairs[start]
        dst[d : d + n].copy_(src[s : s + n])
        start += n
