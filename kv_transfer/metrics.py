"""Counters of one transfer endpoint, plain Python: the observability work exports them.

A sender and a receiver each own one ``TransferMetrics``. Every method is thread-safe and cheap;
``snapshot()`` returns an immutable copy to export. ``subscribe`` lets an exporter observe each
finished transfer's duration (for a histogram) without this package importing one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MetricsSnapshot:
    bytes_transferred: int = 0
    blocks_transferred: int = 0
    blocks_skipped: int = 0  # cached on the decode side, never sent
    transfers_completed: int = 0
    transfer_seconds_sum: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)  # reason -> count
    refused_writes: dict[str, int] = field(default_factory=dict)  # KVStatus name -> count

    @property
    def num_failures(self) -> int:
        return sum(self.failures.values())

    @property
    def num_refused_writes(self) -> int:
        return sum(self.refused_writes.values())


TransferObserver = Callable[[float, int], None]  # (seconds, bytes) of one finished transfer


class TransferMetrics:
    """Thread-safe counters: bytes, blocks, seconds per transfer, failures, refused writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0
        self._blocks = 0
        self._skipped = 0
        self._completed = 0
        self._seconds = 0.0
        self._failures: dict[str, int] = {}
        self._refused: dict[str, int] = {}
        self._observers: list[TransferObserver] = []

    def subscribe(self, observer: TransferObserver) -> None:
        """Call ``observer(seconds, bytes)`` after each completed transfer (on the caller's
        thread; it must be quick and must not raise)."""
        with self._lock:
            self._observers.append(observer)

    def record_blocks(self, num_blocks: int, num_bytes: int) -> None:
        with self._lock:
            self._blocks += num_blocks
            self._bytes += num_bytes

    def record_skipped(self, num_blocks: int) -> None:
        with self._lock:
            self._skipped += num_blocks

    def record_transfer(self, seconds: float, num_bytes: int) -> None:
        with self._lock:
            self._completed += 1
            self._seconds += seconds
            observers = list(self._observers)
        for observer in observers:
            observer(seconds, num_bytes)

    def record_failure(self, reason: str) -> None:
        with self._lock:
            self._failures[reason] = self._failures.get(reason, 0) + 1

    def record_refused(self, status: str) -> None:
        with self._lock:
            self._refused[status] = self._refused.get(status, 0) + 1

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(
                bytes_transferred=self._bytes,
                blocks_transferred=self._blocks,
                blocks_skipped=self._skipped,
                transfers_completed=self._completed,
                transfer_seconds_sum=self._seconds,
                failures=dict(self._failures),
                refused_writes=dict(self._refused),
            )
