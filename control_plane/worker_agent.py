"""The worker side of the control plane: keep this worker registered while it serves.

    start()  register (new epoch) ─▶ every interval_s: heartbeat + load report, KV events
             record gone (lease lapsed, Redis restarted) ─▶ register again (new epoch; KV
             readers resnapshot because the generation changed)
             fenced (a newer process registered this id) ─▶ stop writing, ``on_fenced()``
    drain()  unregister first (routers stop sending), the caller then finishes its work
    stop()   unregister (best effort) and stop the loop

A Redis outage never stops the worker: it keeps serving, counts failed renewals and registers
again once Redis is back (the record is gone by then, or its epoch still matches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from control_plane import lua
from control_plane.kv_events import KVEventLog
from control_plane.load_report import LoadReport
from control_plane.redis_call import ControlPlaneUnavailable
from control_plane.redis_store import RedisStore
from control_plane.stats import ControlPlaneStats
from control_plane.worker_info import WorkerInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadSample:
    """What the worker measures itself; the agent adds id, epoch, seq and time."""

    num_blocks: int
    num_free_blocks: int
    num_running_requests: int
    num_waiting_requests: int
    num_queued_prefill_tokens: int = 0
    step_time_s: float = 0.0


class WorkerAgent:
    def __init__(
        self,
        store: RedisStore,
        info: WorkerInfo,
        sample_load: Callable[[], LoadSample],
        kv_log: KVEventLog | None = None,
        lease_s: float = 3.0,
        interval_s: float = 0.2,
        on_fenced: Callable[[], None] | None = None,
        stats: ControlPlaneStats | None = None,
    ) -> None:
        if interval_s * 3 > lease_s:
            raise ValueError("lease_s must cover at least three heartbeat intervals")
        self.store = store
        self.info = info
        self.epoch = 0
        self.stats = stats or ControlPlaneStats()
        self._sample_load = sample_load
        self._kv_log = kv_log
        self._lease_s = lease_s
        self._interval_s = interval_s
        self._on_fenced = on_fenced
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self._registered = False
        self._ever_registered = False
        self._unregistered = False
        self._failing_since: float | None = None
        self.is_fenced = False

    @property
    def is_registered(self) -> bool:
        """Registered, and since then neither unregistered, fenced, nor cut off from Redis."""
        return (
            self._registered
            and not self._unregistered
            and not self.is_fenced
            and self._failing_since is None
        )

    async def start(self) -> None:
        """Register now if Redis answers (else keep trying in the background), then run."""
        with contextlib.suppress(ControlPlaneUnavailable):
            await self._register()
        self._task = asyncio.create_task(self._run(), name="cp-agent")

    async def drain(self) -> None:
        """Leave the registry (routers stop sending here); keeps nothing else from running."""
        await self._stop_loop()
        await self._unregister()

    async def stop(self) -> None:
        await self.drain()

    # ------------------------------------------------------------------ internals
    async def _register(self) -> None:
        self.epoch, _ = await self.store.register(self.info, self._lease_s)
        self.info = replace(self.info, epoch=self.epoch)
        if self._kv_log is not None:
            self._kv_log.set_generation(self.epoch)
        if self._ever_registered:
            self.stats.reregistrations += 1
        self._registered = self._ever_registered = True
        logger.info(
            "registered %s %s at %s, epoch %d",
            self.info.role,
            self.info.worker_id,
            self.info.grpc_address,
            self.epoch,
        )

    async def _run(self) -> None:
        while not self.is_fenced:
            started = time.monotonic()
            try:
                if not self._registered:
                    await self._register()
                await self._beat()
                if self._failing_since is not None:
                    logger.warning(
                        "control plane reachable again after %.1f s",
                        time.monotonic() - self._failing_since,
                    )
                    self._failing_since = None
            except ControlPlaneUnavailable as e:
                self.stats.lease_renew_failures += 1
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    self.stats.outages += 1
                    logger.warning("lease renewal failed (%s); still serving", e)
            await asyncio.sleep(max(0.0, self._interval_s - (time.monotonic() - started)))

    async def _beat(self) -> None:
        s = self._sample_load()
        self._seq += 1
        report = LoadReport(
            worker_id=self.info.worker_id,
            epoch=self.epoch,
            seq=self._seq,
            timestamp=0.0,  # stamped by Redis
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            num_running_requests=s.num_running_requests,
            num_waiting_requests=s.num_waiting_requests,
            num_queued_prefill_tokens=s.num_queued_prefill_tokens,
            step_time_s=s.step_time_s,
        )
        code = await self.store.heartbeat(self.info.worker_id, self.epoch, self._lease_s, report)
        if code == lua.GONE:
            logger.warning("registry record of %s is gone: registering again", self.info.worker_id)
            self._registered = False
            await self._register()
            return
        if code == lua.FENCED:
            self._fence()
            return
        await self._publish_kv()

    async def _publish_kv(self) -> None:
        if self._kv_log is None:
            return
        while True:
            batch = self._kv_log.take_unpublished()
            if batch is None:
                return
            # A batch that fails to go out is not retried: readers see the gap in sequence
            # numbers and take a snapshot, which is always correct.
            code = await self.store.publish_kv(self.info.worker_id, self.epoch, batch)
            if code == lua.FENCED:
                self._fence()
                return

    def _fence(self) -> None:
        if self.is_fenced:
            return
        self.is_fenced = True
        self.stats.fenced += 1
        logger.error(
            "worker id %s was registered again by another process (epoch %d is stale): "
            "this process stops writing to the registry",
            self.info.worker_id,
            self.epoch,
        )
        if self._on_fenced is not None:
            self._on_fenced()

    async def _stop_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _unregister(self) -> None:
        if self._unregistered or not self._registered or self.is_fenced:
            return
        self._unregistered = True
        try:
            await self.store.unregister(self.info.worker_id, self.epoch)
            logger.info("unregistered %s (epoch %d)", self.info.worker_id, self.epoch)
        except ControlPlaneUnavailable as e:
            logger.warning("could not unregister (%s): the lease will lapse", e)
