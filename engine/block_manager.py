"""Paged KV block accounting: block tables, refcounts, prefix cache with LRU reuse, host tier.

Plain Python over integers; no torch. The model runner owns the memory these ids name.

Device blocks are in exactly one of two states:

    used   ref_cnt > 0, in one or more request block tables
    free   ref_cnt == 0, in the free queue (eviction order: front is reused first)

A free block may still hold a *block hash*: its contents are a reusable prefix until the block is
handed out again (LRU reuse). Blocks freed without a hash go to the front of the queue (worthless);
hashed ones go to the back, a request's last block first, so shared early prefixes outlive tails.

Only full blocks whose every token has been computed get a hash (``cache_blocks``), so a hashed
block's contents are always complete and immutable: sharing needs no copy-on-write.

Host blocks (the swap tier) are plain slots: free or owned by one swapped-out request.

Prefix-cache events (``enable_kv_events``): every hash that becomes a cache entry ("stored")
and every cached block reused for something else ("removed"), in order, for the control
plane's cluster KV index (``control_plane.kv_events``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Literal, overload

from engine.block_hash import BlockHash

BlockId = int
KVCacheEvent = tuple[Literal["stored", "removed"], BlockHash]


class BlockTable(Sequence[BlockId]):
    """A read-only view of one request's block table (the block manager's own list, never
    copied; slices are tuples). Compares equal to any sequence of the same ids."""

    __slots__ = ("_ids",)

    def __init__(self, ids: list[BlockId]) -> None:
        self._ids = ids

    @overload
    def __getitem__(self, index: int) -> BlockId: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[BlockId, ...]: ...
    def __getitem__(self, index: int | slice) -> BlockId | tuple[BlockId, ...]:
        if isinstance(index, slice):
            return tuple(self._ids[index])
        return self._ids[index]

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[BlockId]:
        return iter(self._ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockTable):
            return self._ids == other._ids
        if isinstance(other, (list, tuple)):
            return self._ids == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a live view: its value changes

    def __repr__(self) -> str:
        return f"BlockTable({self._ids!r})"


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int = 0,
        enable_prefix_caching: bool = True,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_host_blocks = num_host_blocks
        self.enable_prefix_caching = enable_prefix_caching

        self._ref_cnt = [0] * num_blocks
        self._block_hash: list[BlockHash | None] = [None] * num_blocks
        self._free: OrderedDict[BlockId, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._cached: dict[BlockHash, BlockId] = {}
        self._tables: dict[str, list[BlockId]] = {}
        self._num_hashed: dict[str, int] = {}  # leading blocks of a table already examined

        self._host_free: list[BlockId] = list(range(num_host_blocks - 1, -1, -1))  # pop() -> 0
        self._host_tables: dict[str, list[BlockId]] = {}
        self._kv_events: list[KVCacheEvent] | None = None

    # ------------------------------------------------------------------ KV events
    def enable_kv_events(self) -> None:
        """Record prefix-cache changes from now on; the hashes cached so far come first (as
        "stored"), so the events alone describe the cache."""
        if self._kv_events is None:
            self._kv_events = [("stored", h) for h in self._cached]

    def take_kv_events(self) -> list[KVCacheEvent]:
        """The events since the last call, oldest first (empty when not enabled)."""
        if not self._kv_events:
            return []
        events, self._kv_events = self._kv_events, []
        return events

    # ------------------------------------------------------------------ queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_free_host_blocks(self) -> int:
        return len(self._host_free)

    @property
    def usage(self) -> float:
        """Fraction of device blocks held by requests (cached-but-free blocks count as free)."""
        return 1.0 - len(self._free) / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, request_id: str) -> BlockTable:
        """A read-only view of the request's device block table (empty for an unknown
        request). The view follows the table as it grows: copy it (``tuple(view)``) to keep
        the table of this moment."""
        return BlockTable(self._tables.get(request_id, []))

    def host_block_table(self, request_id: str) -> list[BlockId]:
        return self._host_tables.get(request_id, [])

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._tables

    def cached_block(self, block_hash: BlockHash) -> BlockId | None:
        return self._cached.get(block_hash)

    def find_cached_prefix(self, block_hashes: Sequence[BlockHash]) -> list[BlockId]:
        """Blocks holding the longest cached prefix of ``block_hashes`` (no refcount change)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[BlockId] = []
        for h in block_hashes:
            b = self._cached.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    # --------------------------------------------------------------- allocation
    def allocate(
        self, request_id: str, num_tokens: int, cached_block_ids: Sequence[BlockId] = ()
    ) -> list[BlockId] | None:
        """Grow the request's table to hold ``num_tokens`` tokens.

        ``cached_block_ids`` (only on a request's first allocation) are prefix-cache hits to
        share; they become the head of the table. Returns the newly allocated block ids, or
        ``None`` (and changes nothing) if there are not enough free blocks.
        """
        table = self._tables.get(request_id)
        if table is not None and cached_block_ids:
            raise ValueError("cached_block_ids may only be given on a request's first allocation")
        num_have = (len(table) if table is not None else 0) + len(cached_block_ids)
        num_new = max(0, self.num_blocks_for(num_tokens) - num_have)
        num_revived = sum(1 for b in cached_block_ids if self._ref_cnt[b] == 0)
        if num_new + num_revived > len(self._free):
            return None
        if table is None:
            table = self._tables[request_id] = []
            self._num_hashed[request_id] = 0
        for b in cached_block_ids:
            if self._ref_cnt[b] == 0:
                del self._free[b]
            self._ref_cnt[b] += 1
            table.append(b)
        self._num_hashed[request_id] = len(table)
        new_blocks = [self._pop_free() for _ in range(num_new)]
        table.extend(new_blocks)
        return new_blocks

    def can_allocate(self, num_new_blocks: int) -> bool:
        return num_new_blocks <= len(self._free)

    def cache_blocks(
        self, request_id: str, block_hashes: Sequence[BlockHash], num_computed_tokens: int
    ) -> None:
        """Publish the hashes of the request's blocks that are full and computed. Idempotent."""
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request_id)
        if table is None:
            return
        start = self._num_hashed[request_id]
        end = min(len(block_hashes), num_computed_tokens // self.block_size, len(table))
        for i in range(start, end):
            b, h = table[i], block_hashes[i]
            if self._block_hash[b] is None and h not in self._cached:
                self._block_hash[b] = h
                self._cached[h] = b
                if self._kv_events is not None:
                    self._kv_events.append(("stored", h))
        self._num_hashed[request_id] = max(start, end)

    def free(self, request_id: str) -> None:
        """Release the request's device and host blocks. Idempotent."""
        table = self._tables.pop(request_id, None)
        self._num_hashed.pop(request_id, None)
        if table is not None:
            self._release(table)
        host = self._host_tables.pop(request_id, None)
        if host is not None:
            self._host_free.extend(reversed(host))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block hash, as vLLM's ``reset_prefix_cache``: the blocks stay
        free but no later prompt hits them (a benchmark's passes start cold; weights were
        swapped). Only while no request holds a block (device or host); returns whether it
        reset."""
        if self._tables or self._host_tables:
            return False
        if self._kv_events is not None:
            self._kv_events.extend(("removed", h) for h in self._cached)
        self._cached.clear()
        self._block_hash = [None] * self.num_blocks
        return True

    # --------------------------------------------------------------------- swap
    def can_swap_out(self, request_id: str) -> bool:
        return len(self._tables.get(request_id, ())) <= len(self._host_free)

    def swap_out(self, request_id: str) -> list[tuple[BlockId, BlockId]]:
        """Move the request to the host tier; returns ``(device_block, host_block)`` copies to do
        *before* the freed device blocks are written again (i.e. before this step's forward)."""
        table = self._tables.pop(request_id)
        self._num_hashed.pop(request_id, None)
        if len(table) > len(self._host_free):
            self._tables[request_id] = table
            raise RuntimeError(f"not enough host blocks to swap out {request_id}")
        host = [self._host_free.pop() for _ in table]
        self._host_tables[request_id] = host
        self._release(table)
        return list(zip(table, host, strict=True))

    def can_swap_in(self, request_id: str, num_extra_blocks: int = 0) -> bool:
        return len(self._host_tables.get(request_id, ())) + num_extra_blocks <= len(self._free)

    def swap_in(self, request_id: str) -> list[tuple[BlockId, BlockId]] | None:
        """Bring a swapped request back; returns ``(host_block, device_block)`` copies, or
        ``None`` if there are not enough free device blocks."""
        host = self._host_tables.get(request_id)
        if host is None:
            raise KeyError(f"{request_id} is not swapped out")
        if len(host) > len(self._free):
            return None
        del self._host_tables[request_id]
        table = [self._pop_free() for _ in host]
        self._tables[request_id] = table
        self._num_hashed[request_id] = 0
        self._host_free.extend(reversed(host))
        return list(zip(host, table, strict=True))

    # --------------------------------------------------------------- invariants
    def check_integrity(self) -> None:
        """Raise AssertionError if any accounting invariant is broken."""
        counts = [0] * self.num_blocks
        for rid, table in self._tables.items():
            assert len(set(table)) == len(table), f"{rid} holds a block twice: {table}"
            for b in table:
                counts[b] += 1
        for b in range(self.num_blocks):
            assert counts[b] == self._ref_cnt[b], (
                f"block {b}: ref {self._ref_cnt[b]} != {counts[b]}"
            )
            assert (self._ref_cnt[b] == 0) == (b in self._free), f"block {b} free-state mismatch"
            h = self._block_hash[b]
            if h is not None:
                assert self._cached.get(h) == b, f"block {b} hash not indexed"
        for h, b in self._cached.items():
            assert self._block_hash[b] == h, f"cache index for block {b} is stale"
        num_used = sum(1 for c in self._ref_cnt if c > 0)
        assert num_used + len(self._free) == self.num_blocks
        host_used = [b for t in self._host_tables.values() for b in t]
        assert len(set(host_used)) == len(host_used), "host block in two tables"
        assert not set(host_used) & set(self._host_free), "host block both free and used"
        assert len(host_used) + len(self._host_free) == self.num_host_blocks
        assert not set(self._tables) & set(self._host_tables), "request on device and host"

    def owners(self) -> set[str]:
        """Ids of the requests holding device or host blocks (a copy)."""
        return set(self._tables) | set(self._host_tables)

    def is_idle(self) -> bool:
        """True when no request holds any block (cached free blocks are fine)."""
        return not self._tables and not self._host_tables and len(self._free) == self.num_blocks

    # ------------------------------------------------------------------ private
    def _pop_free(self) -> BlockId:
        b, _ = self._free.popitem(last=False)
        h = self._block_hash[b]
        if h is not None:
            del self._cached[h]
            self._block_hash[b] = None
            if self._kv_events is not None:
                self._kv_events.append(("removed", h))
        self._ref_cnt[b] = 1
        return b

    def _release(self, table: list[BlockId]) -> None:
        for b in reversed(table):
            self._ref_cnt[b] -= 1
            if self._ref_cnt[b] == 0:
                self._free[b] = None
                if self._block_hash[b] is None:
                    self._free.move_to_end(b, last=False)
