"""Block manager: exact block ids, eviction order, prefix hits, swap, integrity. No torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.block_hash import ROOT_BLOCK_HASH, hash_block, hash_block_tokens
from engine.block_manager import BlockManager


def test_block_hash_golden() -> None:
    # Pinned bytes: every worker and the router's prefix index must agree on these.
    hashes = hash_block_tokens(list(range(32)), 16)
    assert hashes[1].hex() == "cc2f55803318adebf84d002fd8057bf7"
    assert ROOT_BLOCK_HASH.hex() == "413238cdcd081a60de0b66c960237c87"
    assert len(hash_block_tokens(list(range(31)), 16)) == 1  # partial block: no hash
    assert hashes[0] == hash_block(ROOT_BLOCK_HASH, list(range(16)))
    assert hash_block(ROOT_BLOCK_HASH, [1, 2], ("lora-a",)) != hash_block(ROOT_BLOCK_HASH, [1, 2])
    # Same tokens after a different prefix: a different block.
    assert hash_block_tokens([9] * 16 + list(range(16)), 16)[1] != hashes[0]


def test_allocate_exact_ids_and_failure_changes_nothing() -> None:
    bm = BlockManager(8, 4)
    assert bm.allocate("a", 6) == [0, 1]
    assert bm.allocate("a", 9) == [2]
    assert bm.allocate("a", 9) == []  # already enough
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.allocate("b", 100) is None
    assert not bm.has_blocks("b")
    assert bm.num_free_blocks == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.check_integrity()


def test_eviction_order_lru_and_prefix_hits() -> None:
    bm = BlockManager(8, 4)
    tokens = list(range(9))
    h = hash_block_tokens(tokens, 4)  # two full blocks
    bm.allocate("a", 9)  # blocks 0, 1, 2
    bm.cache_blocks("a", h, num_computed_tokens=9)
    assert bm.cached_block(h[0]) == 0 and bm.cached_block(h[1]) == 1
    bm.free("a")
    bm.check_integrity()
    # Uncached block 2 is reused first, then never-used blocks, then the cached tail (1)
    # before the cached head (0).
    assert bm.allocate("c", 24) == [2, 3, 4, 5, 6, 7]
    assert bm.allocate("c", 28) == [1]
    assert bm.cached_block(h[1]) is None and bm.cached_block(h[0]) == 0
    assert bm.find_cached_prefix(h) == [0]
    # Reviving a cached free block consumes a free block: not enough room for 1 hit + 1 new.
    assert bm.allocate("d", 8, cached_block_ids=[0]) is None
    bm.free("c")
    assert bm.allocate("d", 8, cached_block_ids=[0]) == [2]
    assert bm.block_table("d") == [0, 2]
    bm.check_integrity()


def test_reset_prefix_cache_forgets_hashes_only_when_nothing_is_held() -> None:
    bm = BlockManager(8, 4)
    bm.enable_kv_events()
    h = hash_block_tokens(list(range(9)), 4)
    bm.allocate("a", 9)
    bm.cache_blocks("a", h, num_computed_tokens=9)
    assert not bm.reset_prefix_cache()  # "a" still holds its blocks: nothing changes
    assert bm.find_cached_prefix(h) == [0, 1]
    bm.free("a")
    assert bm.reset_prefix_cache()
    assert bm.find_cached_prefix(h) == [] and bm.cached_block(h[0]) is None
    assert bm.num_free_blocks == 8
    assert bm.take_kv_events() == [
        ("stored", h[0]),
        ("stored", h[1]),
        ("removed", h[0]),
        ("removed", h[1]),
    ]
    # The blocks come back as plain free blocks; caching works again after the reset.
    assert bm.allocate("b", 9) is not None
    bm.cache_blocks("b", h, num_computed_tokens=9)
    assert len(bm.find_cached_prefix(h)) == 2
    bm.free("b")
    bm.check_integrity()


def test_shared_blocks_are_refcounted() -> None:
    bm = BlockManager(6, 4)
    h = hash_block_tokens(list(range(8)), 4)
    bm.allocate("a", 8)
    bm.cache_blocks("a", h, 8)
    hits = bm.find_cached_prefix(h)
    assert hits == [0, 1]
    assert bm.allocate("b", 10, cached_block_ids=hits) == [2]
    assert bm.block_table("b") == [0, 1, 2]
    bm.check_integrity()
    bm.free("a")
    assert bm.num_free_blocks == 3  # 0 and 1 still held by b
    bm.free("b")
    bm.free("b")  # idempotent
    bm.check_integrity()
    assert bm.is_idle()


def test_swap_out_and_in() -> None:
    bm = BlockManager(4, 4, num_host_blocks=3)
    bm.allocate("a", 12)
    assert bm.can_swap_out("a")
    assert bm.swap_out("a") == [(0, 0), (1, 1), (2, 2)]
    assert bm.host_block_table("a") == [0, 1, 2] and not bm.has_blocks("a")
    bm.check_integrity()
    bm.allocate("b", 16)
    assert not bm.can_swap_in("a")
    assert bm.swap_in("a") is None
    bm.free("b")
    assert bm.swap_in("a") == [(0, 0), (1, 1), (2, 2)]
    assert bm.num_free_host_blocks == 3
    bm.allocate("c", 4)
    assert not bm.can_swap_out("c") or bm.num_free_host_blocks >= 1
    bm.check_integrity()
    bm.free("a")
    bm.free("c")
    assert bm.is_idle()


def test_integrity_catches_corruption() -> None:
    bm = BlockManager(4, 4)
    bm.allocate("a", 4)
    bm._ref_cnt[0] = 2
    with pytest.raises(AssertionError):
        bm.check_integrity()


def test_block_manager_and_scheduler_import_no_torch() -> None:
    code = (
        "import sys, engine.block_manager, engine.scheduler, engine.block_hash;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_kv_events_replay_to_exactly_the_cached_set() -> None:
    """Replaying the stored/removed events gives the block manager's prefix cache, through
    caching, sharing, LRU eviction and swap, however the requests interleave."""
    import random

    rng = random.Random(3)
    bm = BlockManager(12, 4, num_host_blocks=8)
    bm.allocate("warm", 8)
    bm.cache_blocks("warm", hash_block_tokens(list(range(8)), 4), 8)
    bm.enable_kv_events()  # what was cached before is reported first
    replayed: set[bytes] = set()
    live: dict[str, list[int]] = {}
    for step in range(400):
        if live and rng.random() < 0.4:
            rid = rng.choice(sorted(live))
            bm.free(rid)
            del live[rid]
        else:
            rid = f"r{step}"
            tokens = [rng.randrange(3) for _ in range(rng.randrange(4, 20))]
            hashes = hash_block_tokens(tokens, 4)
            hits = bm.find_cached_prefix(hashes)
            if bm.allocate(rid, len(tokens), hits) is None:
                continue
            bm.cache_blocks(rid, hashes, len(tokens))
            live[rid] = tokens
        for kind, h in bm.take_kv_events():
            if kind == "stored":
                assert h not in replayed
                replayed.add(h)
            else:
                replayed.remove(h)
        assert replayed == set(bm._cached)
        bm.check_integrity()
    assert bm.take_kv_events() == []
