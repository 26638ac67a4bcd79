"""Everything a worker process needs from the control plane, in one object.

    plane = WorkerControlPlane(identity, sample_load, redis_url=...)   # redis_url None: static
    grpc server: add plane.servicer (WorkerControl: info, load, KV snapshot/events)
    engine thread, after every step: plane.on_engine_step(engine.block_manager)
    await plane.start()          # with Redis: register under a lease and heartbeat
    await plane.drain()          # unregister first (routers stop sending), keep serving
    await plane.stop()

The KV event log numbers the block manager's prefix-cache events; with Redis the agent
publishes them on every heartbeat, without it routers poll them over gRPC. Either way a router
that missed some takes a snapshot.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from control_plane.grpc_control import WorkerControlService
from control_plane.kv_events import KVEventLog
from control_plane.redis_store import RedisStore
from control_plane.stats import ControlPlaneStats
from control_plane.worker_agent import LoadSample, WorkerAgent
from control_plane.worker_info import WorkerInfo, WorkerState
from engine.block_manager import BlockManager

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


def new_worker_id(role: str) -> str:
    """A unique id for a worker that was given none (a Kubernetes pod passes its name)."""
    return f"{role}-{secrets.token_hex(4)}"


class WorkerControlPlane:
    def __init__(
        self,
        identity: WorkerInfo,
        sample_load: Callable[[], LoadSample],
        redis_url: str | None = None,
        cluster: str = "default",
        lease_s: float = 3.0,
        heartbeat_s: float = 0.2,
        on_fenced: Callable[[], None] | None = None,
        kv_events: bool = True,
    ) -> None:
        self.stats = ControlPlaneStats()
        self._identity = identity
        self.kv_log = KVEventLog(identity.worker_id, identity.epoch) if kv_events else None
        self._store = RedisStore(redis_url, cluster) if redis_url else None
        self.agent: WorkerAgent | None = None
        if self._store is not None:
            self.agent = WorkerAgent(
                self._store,
                identity,
                sample_load,
                self.kv_log,
                lease_s=lease_s,
                interval_s=heartbeat_s,
                on_fenced=on_fenced,
                stats=self.stats,
            )
        self.servicer = WorkerControlService(self.info, sample_load, self.kv_log)

    def bind(self, grpc_address: str, kv_endpoint: str | None = None) -> None:
        """Set the addresses once the servers are bound (before ``start``)."""
        changes: dict[str, str] = {"grpc_address": grpc_address}
        if kv_endpoint is not None:
            changes["kv_endpoint"] = kv_endpoint
        self._identity = replace(self._identity, **changes)  # type: ignore[arg-type]
        if self.agent is not None:
            self.agent.info = replace(self.agent.info, **changes)  # type: ignore[arg-type]

    def on_step(self, engine: LLMEngine) -> None:
        """``AsyncEngine``'s ``on_step`` hook (engine thread)."""
        self.on_engine_step(engine.block_manager)

    def info(self) -> WorkerInfo:
        """The worker as routers should see it now (epoch and state included)."""
        return self.agent.info if self.agent is not None else self._identity

    @property
    def is_registered(self) -> bool:
        """Holds a live registration in Redis (never without Redis)."""
        return self.agent is not None and self.agent.is_registered

    @property
    def is_fenced(self) -> bool:
        return self.agent is not None and self.agent.is_fenced

    def on_engine_step(self, block_manager: BlockManager) -> None:
        """Engine thread: move the block manager's new prefix-cache events into the log."""
        if self.kv_log is None:
            return
        events = block_manager.take_kv_events()
        if not events:
            return
        stored: list = []
        removed: list = []
        # Keep the order across kinds: flush a run whenever the kind changes.
        for kind, h in events:
            if kind == "stored":
                if removed:
                    self.kv_log.record_removed(removed)
                    removed = []
                stored.append(h)
            else:
                if stored:
                    self.kv_log.record_stored(stored)
                    stored = []
                removed.append(h)
        if stored:
            self.kv_log.record_stored(stored)
        if removed:
            self.kv_log.record_removed(removed)

    @property
    def has_registry(self) -> bool:
        return self._store is not None

    async def kv_endpoints(self, role: str) -> frozenset[str]:
        """The KV endpoints of ``role``'s registered workers (their leases live); raises
        ``ControlPlaneUnavailable`` when Redis does not answer. Only with a registry."""
        assert self._store is not None, "no registry (static mode)"
        _, members = await self._store.list_members()
        return frozenset(m.kv_endpoint for m in members if m.role == role and m.kv_endpoint)

    async def start(self) -> None:
        if self.agent is not None:
            await self.agent.start()

    async def drain(self) -> None:
        """Stop being routable: unregister (Redis) or say DRAINING (static routers see it in
        GetWorkerInfo). In-flight work continues."""
        self._identity = self._identity.with_state(WorkerState.DRAINING)
        if self.agent is not None:
            self.agent.info = replace(self.agent.info, state=WorkerState.DRAINING)
            await self.agent.drain()

    async def stop(self) -> None:
        if self.agent is not None:
            await self.agent.stop()
        if self._store is not None:
            await self._store.close()
