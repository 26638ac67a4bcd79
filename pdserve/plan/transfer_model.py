"""KV pages on the wire: one inbound link per decode worker, first come first served.

A push of ``n`` bytes occupies the link for ``n / bytes_per_s`` once the pushes ahead of it
are through, and lands ``latency_s`` after that. Pushes of one request arrive in order, so
its last push landing means every block is there (the decode side then completes the
transfer), as with the real transports' one connection per peer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdserve.plan.cost_model import TransferCost
from pdserve.plan.events import EventLoop


class KvLink:
    def __init__(self, loop: EventLoop, cost: TransferCost) -> None:
        self.loop = loop
        self.cost = cost
        self._free_at = 0.0
        self.num_bytes = 0
        self.num_pushes = 0
        self.busy_s = 0.0

    def push(
        self, num_bytes: int, landed: Callable[[Any], None] | None = None, arg: Any = None
    ) -> float:
        """Queue a push; ``landed(arg)`` runs when it has arrived. Returns that time."""
        now = self.loop.now
        start = self._free_at if self._free_at > now else now
        wire = num_bytes / self.cost.bytes_per_s if self.cost.bytes_per_s > 0 else 0.0
        self._free_at = start + wire
        self.busy_s += wire
        self.num_bytes += num_bytes
        self.num_pushes += 1
        at = self._free_at + self.cost.latency_s
        if landed is not None:
            self.loop.at(at, landed, arg)
        return at
