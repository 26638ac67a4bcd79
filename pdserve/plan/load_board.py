"""A list kept current by re-reading only the entries that may have changed: the router's
candidate list of one pool (``router_model``), which a 512-worker simulation would otherwise
rebuild from every worker at every poll.

    board = LoadBoard(n, read)     read(i) -> (entry i as of now, the time before which it
                                   cannot change without a mark: inf for a worker at rest;
                                   for one in a decode run, the step end where its reported
                                   blocks next grow)
    board.mark(i)                  entry i may have changed (its worker did something)
    board.put(i, entry)            set entry i now (no read)
    items = board.sync(now)        re-read the marked entries and those whose time has come;
                                   every other entry is what its last read gave

A list handed out (by ``sync`` or ``items``) is never changed afterwards: the next change
copies it first (copy on write), so a caller may keep it. ``sync`` costs O(entries re-read
x log n) plus one list copy when something changed, whatever n is.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoadBoard(Generic[T]):
    def __init__(self, n: int, read: Callable[[int], tuple[T, float]]) -> None:
        self._read = read
        self._items: list[T] = []
        self._due: dict[int, float] = {}  # entries that change with time: when to re-read
        self._heap: list[tuple[float, int]] = []  # (due, entry); stale ones are skipped
        for i in range(n):
            item, due = read(i)
            self._items.append(item)
            self._set_due(i, due)
        self._marked: set[int] = set()
        self._shared = False  # the current list was handed out: copy before a change

    def __len__(self) -> int:
        return len(self._items)

    def mark(self, i: int) -> None:
        self._marked.add(i)

    def put(self, i: int, item: T) -> None:
        if self._items[i] is not item:
            self._writable()[i] = item

    def sync(self, now: float) -> list[T]:
        """Re-read every marked entry and every one due by ``now``; the current list."""
        todo = self._marked
        heap, due = self._heap, self._due
        while heap and heap[0][0] <= now:
            t, i = heapq.heappop(heap)
            if due.get(i) == t:
                del due[i]
                todo.add(i)
        if todo:
            self._marked = set()
            read, items = self._read, self._items
            for i in todo:
                item, t = read(i)
                self._set_due(i, t)
                if items[i] is not item:
                    items = self._writable()
                    items[i] = item
        return self.items

    @property
    def items(self) -> list[T]:
        """The current list (without re-reading anything)."""
        self._shared = True
        return self._items

    @property
    def num_timed(self) -> int:
        """Entries waiting for a time to be re-read (workers in a decode run)."""
        return len(self._due)

    def _set_due(self, i: int, t: float) -> None:
        if t == math.inf:
            self._due.pop(i, None)
        else:
            self._due[i] = t
            heapq.heappush(self._heap, (t, i))

    def _writable(self) -> list[T]:
        if self._shared:
            self._items = self._items.copy()
            self._shared = False
        return self._items
