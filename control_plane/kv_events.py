"""KV-cache events: which prefix-cache blocks a worker stored or dropped, in order.

A worker's block manager reports every block that got a hash (``STORED``: it is now a prefix
hit for any request with that prefix) and every hashed block it reused for something else
(``REMOVED``); ``CLEARED`` drops everything. Each event of a worker process has a sequence
number, one more than the last, and the batch carries the process's ``generation`` (its
registry epoch), so a reader can tell "I missed events" (a gap) and "this is a new process"
(another generation) apart from the events themselves; either means: take a snapshot.

Wire form of a batch (a Redis stream entry field, or a gRPC bytes field): one byte per event
kind followed by its 16-byte hash (none for CLEARED).
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.block_hash import HASH_BYTES, BlockHash


class KVEventKind(enum.Enum):
    STORED = b"s"
    REMOVED = b"r"
    CLEARED = b"c"


@dataclass(frozen=True)
class KVEvent:
    kind: KVEventKind
    block_hash: BlockHash | None = None  # None only for CLEARED


@dataclass(frozen=True)
class KVEventBatch:
    """Events ``first_seq .. last_seq`` of one worker process, in order."""

    worker_id: str
    generation: int
    first_seq: int
    events: tuple[KVEvent, ...]

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.events) - 1

    def encode_events(self) -> bytes:
        out = bytearray()
        for e in self.events:
            out += e.kind.value
            if e.kind is not KVEventKind.CLEARED:
                assert e.block_hash is not None and len(e.block_hash) == HASH_BYTES
                out += e.block_hash
        return bytes(out)

    @staticmethod
    def decode_events(data: bytes) -> tuple[KVEvent, ...]:
        """Inverse of ``encode_events``; raises ValueError for a malformed payload."""
        events: list[KVEvent] = []
        i = 0
        while i < len(data):
            kind = KVEventKind(data[i : i + 1])
            i += 1
            if kind is KVEventKind.CLEARED:
                events.append(KVEvent(kind))
                continue
            h = data[i : i + HASH_BYTES]
            if len(h) != HASH_BYTES:
                raise ValueError("KV event payload ends inside a block hash")
            events.append(KVEvent(kind, BlockHash(bytes(h))))
            i += HASH_BYTES
        return tuple(events)


@dataclass(frozen=True)
class KVSnapshot:
    """Every block hash a worker process caches, as of event ``last_seq``."""

    worker_id: str
    generation: int
    last_seq: int  # 0 before the first event
    block_hashes: frozenset[BlockHash]


class KVEventLog:
    """The worker side: numbers events, keeps the cached set for snapshots and the last
    ``keep`` events for readers catching up. Thread-safe (the engine thread records, the
    publisher and gRPC readers take)."""

    def __init__(self, worker_id: str, generation: int, keep: int = 65536) -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._generation = generation
        self._next_seq = 1
        self._cached: set[BlockHash] = set()
        self._recent: deque[tuple[int, KVEvent]] = deque(maxlen=keep)
        self._unpublished: list[KVEvent] = []
        self._unpublished_first = 1

    @property
    def generation(self) -> int:
        return self._generation

    def set_generation(self, generation: int) -> None:
        """A new registration (epoch): readers must resnapshot; numbering restarts at 1."""
        with self._lock:
            self._generation = generation
            self._next_seq = 1
            self._recent.clear()
            self._unpublished = []
            self._unpublished_first = 1

    def record_stored(self, block_hashes: Iterable[BlockHash]) -> None:
        self._record(KVEvent(KVEventKind.STORED, h) for h in block_hashes)

    def record_removed(self, block_hashes: Iterable[BlockHash]) -> None:
        self._record(KVEvent(KVEventKind.REMOVED, h) for h in block_hashes)

    def record_cleared(self) -> None:
        self._record([KVEvent(KVEventKind.CLEARED)])

    def _record(self, events: Iterable[KVEvent]) -> None:
        with self._lock:
            for e in events:
                if e.kind is KVEventKind.STORED:
                    assert e.block_hash is not None
                    self._cached.add(e.block_hash)
                elif e.kind is KVEventKind.REMOVED:
                    assert e.block_hash is not None
                    self._cached.discard(e.block_hash)
                else:
                    self._cached.clear()
                if not self._unpublished:
                    self._unpublished_first = self._next_seq
                self._unpublished.append(e)
                self._recent.append((self._next_seq, e))
                self._next_seq += 1

    def take_unpublished(self, max_events: int = 4096) -> KVEventBatch | None:
        """The oldest events not yet handed out (at most ``max_events``), or None."""
        with self._lock:
            if not self._unpublished:
                return None
            events = self._unpublished[:max_events]
            batch = KVEventBatch(
                self.worker_id, self._generation, self._unpublished_first, tuple(events)
            )
            self._unpublished = self._unpublished[max_events:]
            self._unpublished_first += len(events)
            return batch

    def since(self, seq: int) -> KVEventBatch | None:
        """Events after ``seq`` if every one of them is still kept, else None (snapshot)."""
        with self._lock:
            last = self._next_seq - 1
            if seq >= last:
                return KVEventBatch(self.worker_id, self._generation, last + 1, ())
            if not self._recent or self._recent[0][0] > seq + 1:
                return None
            events = tuple(e for s, e in self._recent if s > seq)
            return KVEventBatch(self.worker_id, self._generation, seq + 1, events)

    def snapshot(self) -> KVSnapshot:
        with self._lock:
            return KVSnapshot(
                self.worker_id, self._generation, self._next_seq - 1, frozenset(self._cached)
            )


class KVIndex:
    """The router side: block hash -> the workers that cache it, built from every worker's
    events. Not thread-safe (the router's event loop owns it)."""

    def __init__(self) -> None:
        self._workers: dict[str, tuple[int, int, set[BlockHash]]] = {}  # gen, last seq, hashes
        self._holders: dict[BlockHash, set[str]] = {}

    def __len__(self) -> int:
        """(hash, worker) entries."""
        return sum(len(h) for _, _, h in self._workers.values())

    def position(self, worker_id: str) -> tuple[int, int] | None:
        """``(generation, last_seq)`` applied for ``worker_id``, or None if unknown."""
        state = self._workers.get(worker_id)
        return None if state is None else (state[0], state[1])

    def apply(self, batch: KVEventBatch) -> bool:
        """Apply a batch; events already applied are skipped. Returns False (nothing applied)
        when the batch does not follow on from what this index holds for the worker — another
        generation, or missed events: the caller must load a snapshot."""
        state = self._workers.get(batch.worker_id)
        if state is None or state[0] != batch.generation:
            return False
        generation, last_seq, hashes = state
        if batch.first_seq > last_seq + 1:
            return False
        skip = last_seq + 1 - batch.first_seq
        for e in batch.events[skip:]:
            if e.kind is KVEventKind.STORED:
                assert e.block_hash is not None
                hashes.add(e.block_hash)
                self._holders.setdefault(e.block_hash, set()).add(batch.worker_id)
            elif e.kind is KVEventKind.REMOVED:
                assert e.block_hash is not None
                hashes.discard(e.block_hash)
                self._drop_holder(e.block_hash, batch.worker_id)
            else:
                for h in hashes:
                    self._drop_holder(h, batch.worker_id)
                hashes.clear()
        self._workers[batch.worker_id] = (generation, max(last_seq, batch.last_seq), hashes)
        return True

    def load_snapshot(self, snapshot: KVSnapshot) -> None:
        self.remove_worker(snapshot.worker_id)
        hashes = set(snapshot.block_hashes)
        self._workers[snapshot.worker_id] = (snapshot.generation, snapshot.last_seq, hashes)
        for h in hashes:
            self._holders.setdefault(h, set()).add(snapshot.worker_id)

    def remove_worker(self, worker_id: str) -> None:
        state = self._workers.pop(worker_id, None)
        if state is not None:
            for h in state[2]:
                self._drop_holder(h, worker_id)

    def workers(self) -> set[str]:
        return set(self._workers)

    def overlap(self, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        """For every worker holding the prompt's first block: how many leading blocks of
        ``block_hashes`` it caches (a prefix cache serves only a leading run)."""
        depth: dict[str, int] = {}
        alive: set[str] | None = None
        for i, h in enumerate(block_hashes):
            holders = self._holders.get(h)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders
            if not alive:
                break
            for w in alive:
                depth[w] = i + 1
        return depth

    def _drop_holder(self, h: BlockHash, worker_id: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[h]
