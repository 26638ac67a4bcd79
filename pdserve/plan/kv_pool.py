"""A worker's KV blocks, counted (no ids): what requests hold, what a prefix cache keeps, and
the host tier swaps go to.

The engine's block manager keeps every full block of every prompt in its prefix cache until
it is evicted (LRU, only when unreferenced). Workloads here share prefixes by *group* (a
system prompt): the pool remembers, per group, how many of its leading blocks it caches and
how many live requests use them. Unreferenced cached blocks count as free (an allocation
evicts them, least recently used group first), as in the engine. Blocks of prompts that
share nothing are never hit again and are not tracked.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class KvPool:
    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a KV pool needs num_blocks >= 1 and block_size >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_host_blocks = num_host_blocks
        self.num_used = 0  # blocks requests hold privately
        self.num_host_used = 0
        self._group_blocks: dict[int, int] = {}  # group -> cached leading blocks
        self._group_refs: dict[int, int] = {}  # group -> live requests using them
        self._idle: OrderedDict[int, None] = OrderedDict()  # unreferenced groups, LRU first
        self._num_pinned = 0  # cached blocks of referenced groups
        self._num_idle = 0  # cached blocks of unreferenced groups (reclaimable)
        # Told (group, cached blocks) whenever a group's cached blocks change (0: evicted):
        # the router's KV index, as the engine's KV events feed the real one.
        self.listener: Callable[[int, int], None] | None = None

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (idle cached blocks included)."""
        return self.num_blocks - self.num_used - self._num_pinned

    @property
    def num_free_uncached(self) -> int:
        """Free blocks an allocation can take without evicting a cached prefix."""
        return self.num_blocks - self.num_used - self._num_pinned - self._num_idle

    @property
    def num_in_use(self) -> int:
        """Blocks held by live requests, shared prefix blocks once (the router's figure)."""
        return self.num_used + self._num_pinned

    def allocate(self, n: int) -> bool:
        """Take ``n`` private blocks, evicting idle cached groups as needed; False (nothing
        changed) if they do not fit."""
        if n > self.num_free:
            return False
        self.num_used += n
        while self.num_blocks - self.num_used - self._num_pinned - self._num_idle < 0:
            group, _ = self._idle.popitem(last=False)
            self._num_idle -= self._group_blocks.pop(group)
            if self.listener is not None:
                self.listener(group, 0)
        return True

    def free(self, n: int) -> None:
        assert 0 <= n <= self.num_used, (n, self.num_used)
        self.num_used -= n

    # ------------------------------------------------------------ prefix groups
    def cached_blocks(self, group: int) -> int:
        return self._group_blocks.get(group, 0) if group >= 0 else 0

    def ref_group(self, group: int) -> int:
        """A request of ``group`` is admitted: it uses the group's cached blocks (returns how
        many; they stay until its ``unref_group``)."""
        refs = self._group_refs.get(group, 0)
        blocks = self._group_blocks.get(group, 0)
        if refs == 0 and blocks:
            del self._idle[group]
            self._num_idle -= blocks
            self._num_pinned += blocks
        self._group_refs[group] = refs + 1
        return blocks

    def unref_group(self, group: int) -> None:
        refs = self._group_refs[group] - 1
        if refs:
            self._group_refs[group] = refs
            return
        del self._group_refs[group]
        blocks = self._group_blocks.get(group, 0)
        if blocks:
            self._num_pinned -= blocks
            self._num_idle += blocks
            self._idle[group] = None

    def publish_group(self, group: int, num_blocks: int) -> int:
        """A request of ``group`` (it holds a ref) computed the prefix's first ``num_blocks``
        blocks into private blocks: beyond what the group caches, they become the group's.
        Returns how many moved from the request to the group."""
        moved = num_blocks - self._group_blocks.get(group, 0)
        if moved <= 0:
            return 0
        self.num_used -= moved
        self._group_blocks[group] = num_blocks
        self._num_pinned += moved
        if self.listener is not None:
            self.listener(group, num_blocks)
        return moved

    # ---------------------------------------------------------------- host tier
    def swap_out(self, num_private: int, num_shared: int = 0) -> None:
        """Copy a request's blocks to the host tier: its private ones are freed here, its
        shared (prefix) ones stay cached for others. The caller checked the host room."""
        assert self.num_host_used + num_private + num_shared <= self.num_host_blocks
        self.num_host_used += num_private + num_shared
        self.num_used -= num_private

    def swap_in(self, n: int) -> bool:
        if not self.allocate(n):
            return False
        self.num_host_used -= n
        return True

    def check_integrity(self) -> None:
        """The counts add up (tests call it after every event)."""
        assert 0 <= self.num_used and 0 <= self.num_host_used <= self.num_host_blocks
        assert self._num_pinned == sum(self._group_blocks.get(g, 0) for g in self._group_refs)
        assert self._num_idle == sum(self._group_blocks[g] for g in self._idle)
        assert set(self._idle).isdisjoint(self._group_refs)
        cached = {g for g in self._group_refs if self._group_blocks.get(g)}
        assert set(self._idle) | cached == set(self._group_blocks)
        assert self.num_used + self._num_pinned + self._num_idle <= self.num_blocks
