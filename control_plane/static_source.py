"""Feeds a router's ``ClusterView`` from a fixed list of workers, with no Redis: the embedded
default of ``pdserve serve`` and ``pdserve router --decode H:P --prefill H:P``.

Every ``poll_s`` it asks each worker's ``WorkerControl`` service for its load and its KV events
since the last ones (a snapshot when the worker says it no longer keeps them). A worker that
does not answer is left out of routing until it answers again; a worker that answers with a
new epoch or id is a new process (its index entries are rebuilt).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc

from control_plane.cluster_view import ClusterView
from control_plane.grpc_control import WorkerControlClient
from control_plane.worker_info import WorkerInfo, WorkerRole
from pdserve.tls import channel_options

logger = logging.getLogger(__name__)


class _Target:
    def __init__(self, address: str, role: WorkerRole, channel: grpc.aio.Channel) -> None:
        self.address = address
        self.role = role
        self.channel = channel
        self.client = WorkerControlClient(channel)
        self.info: WorkerInfo | None = None
        self.reachable = False
        self.last_error = ""
        self.relist_at = 0.0  # monotonic: when to ask who the worker is again


class StaticClusterSource:
    def __init__(
        self,
        view: ClusterView,
        decode: Sequence[str],
        prefill: Sequence[str],
        channels: dict[str, grpc.aio.Channel] | None = None,
        poll_s: float = 0.1,
        relist_s: float = 1.0,
    ) -> None:
        """``channels`` lets the router share its channels (address -> channel). Load and KV
        events are polled every ``poll_s``; who each worker is (state, epoch) every
        ``relist_s``."""
        self.view = view
        self._poll_s = poll_s
        self._relist_s = relist_s
        shared = channels or {}
        self._own: list[grpc.aio.Channel] = []
        self._targets: list[_Target] = []
        for role, addresses in (("decode", decode), ("prefill", prefill)):
            for address in addresses:
                channel = shared.get(address)
                if channel is None:
                    channel = grpc.aio.insecure_channel(address, options=channel_options(None))
                    self._own.append(channel)
                self._targets.append(_Target(address, role, channel))  # type: ignore[arg-type]
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.poll_once()
        self._task = asyncio.create_task(self._run(), name="cp-static")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for channel in self._own:
            await channel.close()

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(t) for t in self._targets))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            await self.poll_once()

    async def _poll(self, t: _Target) -> None:
        try:
            now = time.monotonic()
            if t.info is None or now >= t.relist_at:
                await self._learn(t)
                t.relist_at = now + self._relist_s
            assert t.info is not None
            report = await t.client.load(t.info.worker_id, self.view.registry_time())
            if report.epoch != t.info.epoch:
                await self._learn(t)  # restarted behind the same address
                assert t.info is not None
            self.view.update_load(report)
            await self._follow_kv(t, t.info)
            if not t.reachable:
                t.reachable = True
                t.last_error = ""
                self.view.mark_ok(t.info.worker_id)
        except (grpc.aio.AioRpcError, ValueError) as e:
            why = e.code().name if isinstance(e, grpc.aio.AioRpcError) else str(e)
            if why != t.last_error:  # once per kind of failure, not once per poll
                t.last_error = why
                logger.warning("%s worker at %s is not usable: %s", t.role, t.address, why)
            t.reachable = False
            if t.info is not None:
                # Out of routing until it answers again (a stopped worker's polls hang for
                # the call timeout, longer than any fixed window): even as the last one when
                # it cannot be reached at all (gone); while another can serve when a poll
                # only timed out (a loaded host is no proof the worker is gone).
                gone = (
                    isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.UNAVAILABLE
                )
                self.view.mark_failed(t.info.worker_id, for_s=float("inf"), stalled=gone)

    async def _learn(self, t: _Target) -> None:
        info = await t.client.info()
        if info.role != t.role:
            raise ValueError(f"{t.address} is a {info.role} worker, listed as {t.role}")
        new_process = t.info is None or (t.info.worker_id, t.info.epoch) != (
            info.worker_id,
            info.epoch,
        )
        if t.info is not None and t.info.worker_id != info.worker_id:
            self.view.remove_member(t.info.worker_id)
        t.info = info
        self.view.upsert_member(info)
        if new_process:
            self.view.kv_index.remove_worker(info.worker_id)

    async def _follow_kv(self, t: _Target, info: WorkerInfo) -> None:
        if self.view.member(info.worker_id) is None:
            return  # refused (fingerprint)
        position = self.view.kv_index.position(info.worker_id)
        batch = None
        if position is not None:
            batch = await t.client.events(info.worker_id, position[0], position[1])
        if batch is None or not self.view.kv_index.apply(batch):
            self.view.kv_index.load_snapshot(await t.client.snapshot())
            self.view.stats.kv_snapshots += 1
