"""Which workers serve a request: the router's cluster view, its routing policy and its
dispatch ledger behind one call.

    ClusterRouter.static(decode=[...], prefill=[...])   no Redis: poll each worker's
                                                        WorkerControl (control_plane.static_source)
    ClusterRouter.redis(url, cluster)                   members, loads and KV events from Redis
                                                        (control_plane.redis_source); sends
                                                        reserved atomically across routers
    route = await cluster.route(request_id, prompt_ids)
        candidates: routable members with their corrected load (ClusterView), the leading
        blocks each caches (the cluster KV index) ─▶ policy.choose ─▶ the ledger reserves the
        decode worker (another router may have taken the last room) ─▶ Route
    await cluster.release(route)                        when the request is over

The block size comes from the workers' fingerprint (every member must share one: the view
refuses a worker whose model or KV layout differs from the first one it admitted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from control_plane.cluster_view import ClusterView, WorkerLoadView
from control_plane.grpc_control import WorkerControlClient
from control_plane.kv_events import KVSnapshot
from control_plane.ledger import DispatchLedger, LocalLedger, RedisLedger
from control_plane.redis_source import RedisClusterSource
from control_plane.redis_store import RedisStore
from control_plane.static_source import StaticClusterSource
from control_plane.worker_info import WorkerInfo, WorkerRole
from engine.block_hash import hash_block_tokens
from pdserve.tls import ClientTls, open_channel
from protos.pdserve.v1 import worker_pb2_grpc
from router.backend import Load
from router.errors import ErrorKind, RequestError
from router.routing import NoWorkerError, RouteCandidate, RouteRequest, RoutingPolicy

logger = logging.getLogger(__name__)

Source = StaticClusterSource | RedisClusterSource


@dataclass(frozen=True)
class Target:
    """One worker as the backend calls it."""

    worker_id: str
    role: WorkerRole
    address: str
    stub: Any  # DecodeWorkerStub | PrefillWorkerStub


@dataclass(frozen=True)
class Route:
    request_id: str
    decode: tuple[Target, ...]  # the reserved worker first, then the others to retry on
    prefill: tuple[Target, ...]  # empty: the decode worker prefills the prompt itself
    reason: str  # kv_hit | load | local_prefill | round_robin
    num_blocks: int

    @property
    def is_local(self) -> bool:
        return not self.prefill


class ClusterRouter:
    def __init__(
        self,
        view: ClusterView,
        ledger: DispatchLedger,
        policy: RoutingPolicy,
        local_prefill_max_tokens: int = 0,
        store: RedisStore | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        """Use ``static`` or ``redis``. ``local_prefill_max_tokens``: prompts this short may
        be prefilled on decode even when no prefill worker is routable (-1: every prompt).
        ``tls``: dial the workers over mutual TLS (pdserve.tls)."""
        self._tls = tls
        self.view = view
        self.source: Source | None = None
        # Made in start(): gRPC aio channels belong to the event loop that creates them.
        self._make_source: Callable[[], Source] | None = None
        self.ledger = ledger
        self.policy = policy
        self.stats = view.stats
        self._local_max = local_prefill_max_tokens
        self._store = store
        self._channels: dict[str, grpc.aio.Channel] = {}

    @classmethod
    def static(
        cls,
        decode: Sequence[str],
        prefill: Sequence[str],
        policy: RoutingPolicy,
        local_prefill_max_tokens: int = 0,
        poll_s: float = 0.1,
        tls: ClientTls | None = None,
    ) -> ClusterRouter:
        view = ClusterView(adopt_fingerprint=True)
        router = cls(view, LocalLedger(view), policy, local_prefill_max_tokens, tls=tls)

        def source() -> Source:
            channels = {a: router.channel(a) for a in (*decode, *prefill)}
            return StaticClusterSource(view, decode, prefill, channels, poll_s=poll_s)

        router._make_source = source
        return router

    @classmethod
    def redis(
        cls,
        url: str,
        cluster: str,
        policy: RoutingPolicy,
        local_prefill_max_tokens: int = 0,
        load_poll_s: float = 0.1,
        tls: ClientTls | None = None,
    ) -> ClusterRouter:
        view = ClusterView(adopt_fingerprint=True)
        store = RedisStore(url, cluster)
        ledger = RedisLedger(store, view)
        router = cls(view, ledger, policy, local_prefill_max_tokens, store, tls)
        router._make_source = lambda: RedisClusterSource(
            store, view, router._snapshot, load_poll_s=load_poll_s
        )
        return router

    async def start(self) -> None:
        """On the event loop that serves requests (the channels are bound to it)."""
        assert self._make_source is not None, "made by ClusterRouter.static or .redis"
        self.source = self._make_source()
        await self.source.start()

    async def close(self) -> None:
        if self.source is not None:
            await self.source.close()
        for channel in self._channels.values():
            await channel.close()
        if self._store is not None:
            await self._store.close()

    # ------------------------------------------------------------------ routing
    async def route(
        self, request_id: str, prompt_ids: Sequence[int], prefer_decode: str | None = None
    ) -> Route:
        """Choose and reserve; raises RequestError(UNAVAILABLE) naming the pool that has no
        routable worker. ``prefer_decode``: that decode worker first when it is routable and
        has room (a migrated request whose prefill failed: that worker kept the part of its
        KV that arrived)."""
        decode = self.view.views("decode")
        if not decode:
            raise self._unavailable("decode")
        prefill = self.view.views("prefill")
        block_size = decode[0].info.fingerprint.block_size
        local_ok = self._local_max < 0 or 0 < len(prompt_ids) <= self._local_max
        if not prefill and not local_ok:
            raise self._unavailable("prefill")
        hashes = hash_block_tokens(prompt_ids, block_size)
        cached = self.view.kv_index.overlap(hashes) if hashes else {}
        request = RouteRequest(len(prompt_ids), block_size, cached)
        try:
            choice = self.policy.choose(request, _candidates(decode), _candidates(prefill))
        except NoWorkerError:
            raise self._unavailable("decode") from None
        ranked = list(choice.decode_ranking)
        if prefer_decode is not None and any(v.info.worker_id == prefer_decode for v in decode):
            # First even when the policy left it out (its load share is over the cap: the
            # failed attempt may still count there): its KV is what the retry lacks.
            ranked = [
                (prefer_decode, 0.0),
                *(ranking for ranking in ranked if ranking[0] != prefer_decode),
            ]
        num_blocks = request.num_prompt_blocks
        chosen = await self.ledger.reserve(request_id, num_blocks, ranked)
        if chosen is None:  # nobody has room now: decode queues it (never refused for room)
            chosen = ranked[0][0]
            self.view.sent(chosen, request_id, num_blocks)
        order = [chosen, *(w for w, _ in ranked if w != chosen)]
        reason = choice.reason
        self.stats.routing_decisions[reason] += 1
        prefill_order = () if choice.prefill_id is None else choice.prefill_ranking
        if choice.prefill_id is not None and not prefill_order:
            prefill_order = (choice.prefill_id,)
        self.stats.routed_requests["decode", chosen] += 1
        if prefill_order:
            self.stats.routed_requests["prefill", prefill_order[0]] += 1
        return Route(
            request_id,
            tuple(self._target(w) for w in order),
            tuple(self._target(w) for w in prefill_order),
            reason,
            num_blocks,
        )

    async def retry_decode(self, route: Route) -> Route | None:
        """The reserved decode worker refused the request (busy or draining): the same route
        on the next one (counted as ``retry_other_worker``), or None when none is left."""
        await self.ledger.release(route.decode[0].worker_id, route.request_id)
        self.view.mark_failed(route.decode[0].worker_id, for_s=1.0)
        rest = route.decode[1:]
        if not rest:
            return None
        self.view.sent(rest[0].worker_id, route.request_id, route.num_blocks)
        self.stats.routing_decisions["retry_other_worker"] += 1
        self.stats.routed_requests["decode", rest[0].worker_id] += 1
        return Route(route.request_id, rest, route.prefill, route.reason, route.num_blocks)

    async def release(self, route: Route) -> None:
        await self.ledger.release(route.decode[0].worker_id, route.request_id)

    def mark_stalled(self, target: Target) -> None:
        """A request saw ``target`` stall: route nothing new there for a while (it rejoins
        when it answers the control plane again)."""
        self.view.mark_failed(target.worker_id, for_s=5.0, stalled=True)

    # ------------------------------------------------------------------ health and load
    def num_routable(self, role: WorkerRole) -> int:
        return len(self.view.routable(role))

    def load(self) -> Load:
        """Routable workers' latest reports together (a dead or stale worker counts not)."""
        views = [*self.view.views("decode"), *self.view.views("prefill")]
        reports = [v.report for v in views if v.report is not None and not v.is_stale]
        return Load(
            num_blocks=sum(r.num_blocks for r in reports),
            num_free_blocks=sum(r.num_free_blocks for r in reports),
            num_running_requests=sum(r.num_running_requests for r in reports),
            num_waiting_requests=sum(r.num_waiting_requests for r in reports),
        )

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._tls)
        return channel

    # ------------------------------------------------------------------ private
    def _target(self, worker_id: str) -> Target:
        info = self.view.member(worker_id)
        assert info is not None, worker_id
        channel = self.channel(info.grpc_address)
        stub_cls: Any = (
            worker_pb2_grpc.DecodeWorkerStub
            if info.role == "decode"
            else worker_pb2_grpc.PrefillWorkerStub
        )
        return Target(worker_id, info.role, info.grpc_address, stub_cls(channel))

    async def _snapshot(self, info: WorkerInfo) -> KVSnapshot:
        return await WorkerControlClient(self.channel(info.grpc_address)).snapshot()

    def _unavailable(self, role: WorkerRole) -> RequestError:
        members = self.view.members(role)
        routable = len(self.view.routable(role))
        return RequestError(
            ErrorKind.UNAVAILABLE,
            f"no {role} worker is available ({len(members)} known, {routable} accepting requests)",
        )


def _candidates(views: Sequence[WorkerLoadView]) -> list[RouteCandidate]:
    return [
        RouteCandidate(
            worker_id=v.worker_id,
            num_blocks=v.info.num_blocks,
            num_used_blocks=v.num_used_blocks,
            num_active_requests=v.num_active_requests,
            num_queued_prefill_tokens=v.num_queued_prefill_tokens,
        )
        for v in views
    ]
