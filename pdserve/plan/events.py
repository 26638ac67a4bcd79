"""The discrete-event loop: a heap of (time, sequence, callback, argument).

Events at the same time run in the order they were scheduled (the sequence number breaks
ties), so a run is deterministic. Nothing is ever removed from the heap: an owner that
re-plans bumps its own version number and ignores callbacks that carry an older one, which is
cheaper than deleting from a heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any], None]


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = 0
        self.num_events = 0

    def at(self, t: float, fn: Callback, arg: Any = None) -> None:
        """Run ``fn(arg)`` at time ``t`` (never before now: a past time runs now)."""
        self._seq += 1
        heapq.heappush(self._heap, (t if t > self.now else self.now, self._seq, fn, arg))

    def after(self, delay: float, fn: Callback, arg: Any = None) -> None:
        self.at(self.now + delay, fn, arg)

    def run(self, until: float = float("inf")) -> None:
        """Run events in time order until none is left or the next is after ``until``."""
        heap = self._heap
        pop = heapq.heappop
        n = 0
        while heap and heap[0][0] <= until:
            t, _, fn, arg = pop(heap)
            self.now = t
            fn(arg)
            n += 1
        self.num_events += n
        if until != float("inf") and until > self.now:
            self.now = until

    @property
    def is_empty(self) -> bool:
        return not self._heap
