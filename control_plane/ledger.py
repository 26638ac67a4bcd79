"""Who gets the next request when several routers choose at once.

A router ranks decode workers by its own picture; the ledger makes the final pick and records
the send, so that a worker with room for one request is not handed two by two routers that
both saw it free:

    LocalLedger   one router: the first ranked worker that has room in this router's view
    RedisLedger   many routers: an atomic select-and-reserve in Redis over the top ranked
                  workers, counting every router's sends since each worker's last report;
                  falls back to LocalLedger while Redis is out

Either way the send is also recorded in the router's ``ClusterView`` (its own correction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from control_plane.cluster_view import ClusterView
from control_plane.redis_call import ControlPlaneUnavailable
from control_plane.redis_store import RedisStore


class DispatchLedger(Protocol):
    async def reserve(
        self, request_id: str, num_blocks: int, ranked: Sequence[tuple[str, float]]
    ) -> str | None:
        """Pick a worker from ``ranked`` ((worker id, cost), cheapest first) with room for
        ``num_blocks`` and record the send; None when none has room."""
        ...

    async def release(self, worker_id: str, request_id: str) -> None:
        """The send did not happen or is over: stop counting it. Idempotent."""
        ...


class LocalLedger:
    def __init__(self, view: ClusterView) -> None:
        self.view = view

    async def reserve(
        self, request_id: str, num_blocks: int, ranked: Sequence[tuple[str, float]]
    ) -> str | None:
        for worker_id, _ in ranked:
            if self.view.member(worker_id) is None:
                continue
            if self.view.view(worker_id).num_free_blocks >= num_blocks:
                self.view.sent(worker_id, request_id, num_blocks)
                return worker_id
        return None

    async def release(self, worker_id: str, request_id: str) -> None:
        self.view.finished(worker_id, request_id)


class RedisLedger:
    def __init__(
        self,
        store: RedisStore,
        view: ClusterView,
        top_k: int = 4,
        pending_ttl_s: float = 2.0,
        pending_weight: float = 1.0,
    ) -> None:
        self.store = store
        self.view = view
        self._local = LocalLedger(view)
        self._top_k = top_k
        self._ttl_s = pending_ttl_s
        self._weight = pending_weight

    async def reserve(
        self, request_id: str, num_blocks: int, ranked: Sequence[tuple[str, float]]
    ) -> str | None:
        if self.view.in_outage:
            return await self._local.reserve(request_id, num_blocks, ranked)
        top = list(ranked[: self._top_k])
        try:
            chosen, _ = await self.store.select_and_reserve(
                request_id, num_blocks, top, self._ttl_s, self._weight
            )
        except ControlPlaneUnavailable:
            return await self._local.reserve(request_id, num_blocks, ranked)
        if chosen is None and len(ranked) > len(top):
            return await self._local.reserve(request_id, num_blocks, ranked[len(top) :])
        if chosen is not None:
            if top and chosen != top[0][0]:
                # Our own sends are already in our ranking: only other routers' sends (seen
                # in Redis) move the pick off our first choice.
                self.view.stats.cross_router_conflicts += 1
            self.view.sent(chosen, request_id, num_blocks)
        return chosen

    async def release(self, worker_id: str, request_id: str) -> None:
        self.view.finished(worker_id, request_id)
        try:
            await self.store.release_pending(worker_id, request_id)
        except ControlPlaneUnavailable:
            pass  # the entry expires by itself
