from __future__ import annotations

from engine.block_hash import hash_block_tokens
from router.prefix_index import PrefixIndex


def test_longest_prefix_and_lru_bound() -> None:
    idx = PrefixIndex(max_blocks_per_worker=4)
    a = hash_block_tokens(list(range(64)), 16)  # 4 blocks
    b = hash_block_tokens(list(range(32)) + [999] * 32, 16)  # shares 2 blocks with a
    idx.insert("w1", a)
    assert idx.match("w1", a) == 4
    assert idx.match("w1", b) == 2
    assert idx.match("w2", a) == 0
    idx.insert("w1", b[2:])  # evicts a's two oldest blocks (the shared head)
    assert idx.match("w1", a) == 0
    idx.forget("w1")
    assert idx.match("w1", b) == 0
