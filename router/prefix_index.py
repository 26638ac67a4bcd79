"""An approximate prefix index: which worker probably holds which KV blocks.

The router remembers, per worker, the chained block hashes (``engine.block_hash``, the same
function every worker uses for its prefix cache) of the prompts it sent there, in LRU order with
a bounded size. Routing a prompt to the worker with the longest remembered prefix turns repeated
system prompts and multi-turn chats into prefix-cache hits. It is a hint, never a guarantee: a
worker may have evicted the blocks, which only costs a recompute.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.block_hash import BlockHash


class PrefixIndex:
    def __init__(self, max_blocks_per_worker: int = 100_000) -> None:
        self._max = max_blocks_per_worker
        self._by_worker: dict[str, OrderedDict[BlockHash, None]] = {}

    def insert(self, worker: str, block_hashes: Sequence[BlockHash]) -> None:
        """Remember that ``worker`` computed (and so caches) these blocks."""
        lru = self._by_worker.setdefault(worker, OrderedDict())
        for h in block_hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self._max:
            lru.popitem(last=False)

    def match(self, worker: str, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of the prompt ``worker`` probably holds."""
        lru = self._by_worker.get(worker)
        if not lru:
            return 0
        n = 0
        for h in block_hashes:
            if h not in lru:
                break
            n += 1
        return n

    def forget(self, worker: str) -> None:
        self._by_worker.pop(worker, None)
