"""engine/kv_cache.py's swaps on the CPU: whole blocks copied both ways, by id pairs in any
order, runs of consecutive ids and single blocks alike, and nothing else touched."""

from __future__ import annotations

import pytest
import torch

from engine.kv_cache import KVCache
from engine.kv_cache_spec import KVCacheSpec

PAIRS = {
    "one run": [(3, 0), (4, 1), (5, 2), (6, 3)],
    "scattered": [(9, 7), (2, 0), (14, 3), (5, 6)],
    "runs and singles": [(0, 4), (1, 5), (2, 6), (10, 0), (7, 2), (8, 3)],
    "descending": [(6, 3), (5, 2), (4, 1), (3, 0)],
}


@pytest.mark.parametrize("pairs", PAIRS.values(), ids=PAIRS.keys())
def test_swap_out_then_in_moves_exactly_the_named_blocks(pairs: list[tuple[int, int]]) -> None:
    spec = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype="float32")
    cache = KVCache(spec, num_blocks=16, num_host_blocks=8, device=torch.device("cpu"))
    cache.pool.copy_(torch.arange(cache.pool.numel(), dtype=torch.float32).view_as(cache.pool))
    cache.host_pool.fill_(-1.0)
    original = cache.pool.clone()

    cache.swap_out(pairs)
    for dev, host in pairs:
        assert torch.equal(cache.host_pool[host], original[dev])
    swapped = {host for _, host in pairs}
    for host in set(range(8)) - swapped:
        assert bool((cache.host_pool[host] == -1.0).all())  # untouched

    targets = [(host, (dev + 8) % 16) for dev, host in pairs]  # back, to other blocks
    cache.swap_in(targets)
    expected = original.clone()
    for dev, _ in pairs:
        expected[(dev + 8) % 16] = original[dev]
    assert torch.equal(cache.pool, expected)
    cache.swap_out([])
    cache.swap_in([])
