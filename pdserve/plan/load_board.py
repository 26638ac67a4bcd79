"""A list kept current by re-reading only the entries that may have changed: the router's
candidate list of one pool (``router_model``), which a 512-worker simulation would otherwise
rebuild from every worker at every poll.

    board = LoadBoard(n, read)     read(i) -> (entry i as of now, whether it may change
                                   without a mark: e.g. a worker in a decode run, whose
                                   reported blocks grow with time)
    board.mark(i)                  entry i may have changed (its worker did something)
    board.put(i, entry)            set entry i now (no read)
    items = board.sync()           re-read the marked entries and the moving ones; every
                                   other entry is what its last read gave

A list handed out (by ``sync`` or ``items``) is never changed afterwards: the next change
copies it first (copy on write), so a caller may keep it. ``sync`` costs O(marked + moving)
plus one list copy when something changed, whatever n is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoadBoard(Generic[T]):
    def __init__(self, n: int, read: Callable[[int], tuple[T, bool]]) -> None:
        self._read = read
        self._items: list[T] = []
        self._moving: set[int] = set()
        for i in range(n):
            item, moving = read(i)
            self._items.append(item)
            if moving:
                self._moving.add(i)
        self._marked: set[int] = set()
        self._shared = False  # the current list was handed out: copy before a change

    def __len__(self) -> int:
        return len(self._items)

    def mark(self, i: int) -> None:
        self._marked.add(i)

    def put(self, i: int, item: T) -> None:
        if self._items[i] is not item:
            self._writable()[i] = item

    def sync(self) -> list[T]:
        """Re-read every marked and every moving entry; the current list."""
        if self._marked or self._moving:
            todo = self._marked | self._moving
            self._marked = set()
            moving: set[int] = set()
            read, items = self._read, self._items
            for i in todo:
                item, still = read(i)
                if still:
                    moving.add(i)
                if items[i] is not item:
                    items = self._writable()
                    items[i] = item
            self._moving = moving
        return self.items

    @property
    def items(self) -> list[T]:
        """The current list (without re-reading anything)."""
        self._shared = True
        return self._items

    @property
    def num_moving(self) -> int:
        return len(self._moving)

    def _writable(self) -> list[T]:
        if self._shared:
            self._items = self._items.copy()
            self._shared = False
        return self._items
