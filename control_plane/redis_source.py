"""Feeds a router's ``ClusterView`` from Redis: membership (event stream + periodic re-list),
load reports, and every member's KV event stream (with snapshots on a gap).

    membership loop: XREAD the events stream (wakes on join/drain/leave at once) and re-list
                     every ``relist_s`` whatever happened, so a missed or trimmed event can
                     never leave a dead worker routable beyond one re-list
    load loop:       read every member's load report every ``load_poll_s``
    kv loop:         XREAD every member's KV stream; a batch that does not follow on (gap,
                     trimmed stream, new generation) -> snapshot the worker (``snapshot_fn``)

A Redis outage is logged once and counted; the view keeps what it had (``in_outage`` stops
lease expiry) and every loop retries with backoff. Every Redis call is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from control_plane.cluster_view import ClusterView
from control_plane.kv_events import KVSnapshot
from control_plane.redis_call import ControlPlaneUnavailable
from control_plane.redis_store import RedisStore, StreamedKVBatch
from control_plane.worker_info import WorkerInfo

logger = logging.getLogger(__name__)

SnapshotFn = Callable[[WorkerInfo], Awaitable[KVSnapshot]]


class RedisClusterSource:
    def __init__(
        self,
        store: RedisStore,
        view: ClusterView,
        snapshot_fn: SnapshotFn | None = None,
        relist_s: float = 1.0,
        load_poll_s: float = 0.1,
        kv_block_s: float = 0.5,
    ) -> None:
        self.store = store
        self.view = view
        self._snapshot_fn = snapshot_fn
        self._relist_s = relist_s
        self._load_poll_s = load_poll_s
        self._kv_block_s = kv_block_s
        self._tasks: list[asyncio.Task[None]] = []
        self._kv_positions: dict[str, bytes] = {}
        self._outage_since: float | None = None
        self._changed = asyncio.Event()  # membership changed: restart the KV read
        self._snapshot_after: dict[str, float] = {}  # worker -> no new try before (monotonic)
        self._generation: str | None = None  # Redis's dataset (MemberListing.generation)
        self._forgotten: set[str] = set()  # members Redis forgot (data loss), not yet back

    async def start(self) -> None:
        """One re-list (bounded; an unreachable Redis is an outage, not an error), then the
        loops in the background."""
        try:
            await self.relist()
        except ControlPlaneUnavailable as e:
            self._outage(e)
        self._tasks = [
            asyncio.create_task(self._membership_loop(), name="cp-membership"),
            asyncio.create_task(self._load_loop(), name="cp-load"),
        ]
        if self._snapshot_fn is not None:
            self._tasks.append(asyncio.create_task(self._kv_loop(), name="cp-kv"))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        # gather, not "suppress(CancelledError): await t": a cancellation of close() itself
        # must propagate.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # ------------------------------------------------------------------ outage bookkeeping
    def _outage(self, error: Exception) -> None:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.view.in_outage = True
            self.view.stats.outages += 1
            logger.warning(
                "control plane unreachable (%s): routing on the last known membership and load",
                error,
            )

    def _recovered(self) -> None:
        if self._outage_since is not None:
            seconds = time.monotonic() - self._outage_since
            self.view.stats.outage_seconds += seconds
            self._outage_since = None
            self.view.in_outage = False
            logger.warning("control plane reachable again after %.1f s", seconds)

    # ------------------------------------------------------------------ membership
    async def relist(self) -> None:
        listing = await self.store.listing()
        now, infos, generation = listing.now, listing.members, listing.generation
        self.view.sync_clock(now)
        if self._generation is not None and generation != self._generation:
            # Redis lost its data (restarted empty): every worker registers again at its next
            # heartbeat. Until then (or the lease it held passes), one missing from a listing
            # is re-registering, not gone: dropping it would leave a pool with none to route to.
            self._forgotten = {m.worker_id for m in self.view.members()}
            logger.warning(
                "the control plane's Redis lost its data: keeping the %d known workers until "
                "they register again or their leases pass",
                len(self._forgotten),
            )
        self._generation = generation
        self._forgotten -= {i.worker_id for i in infos}  # registered again: no leniency
        self.view.set_members(infos, keep=self._forgotten)
        self._forgotten &= {m.worker_id for m in self.view.members()}
        self._recovered()
        self._changed.set()

    async def _membership_loop(self) -> None:
        last_id = b"$"
        with contextlib.suppress(ControlPlaneUnavailable):
            last_id = await self.store.last_event_id()
        next_relist = time.monotonic() + self._relist_s
        backoff = 0.1
        while True:
            try:
                wait = max(0.01, min(1.0, next_relist - time.monotonic()))
                events = await self.store.read_events(last_id, block_s=wait)
                if events:
                    last_id = events[-1].stream_id
                    await self.relist()  # an event means "look now": one listing is truth
                    next_relist = time.monotonic() + self._relist_s
                elif time.monotonic() >= next_relist:
                    await self.relist()
                    next_relist = time.monotonic() + self._relist_s
                backoff = 0.1
            except ControlPlaneUnavailable as e:
                self._outage(e)
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
                with contextlib.suppress(ControlPlaneUnavailable):
                    last_id = await self.store.last_event_id()

    # ------------------------------------------------------------------ load
    async def _load_loop(self) -> None:
        while True:
            await asyncio.sleep(self._load_poll_s)
            ids = [m.worker_id for m in self.view.members()]
            if not ids:
                continue
            try:
                now, loads = await self.store.read_loads(ids)
            except ControlPlaneUnavailable as e:
                self._outage(e)
                continue
            self.view.sync_clock(now)
            for report in loads.values():
                self.view.update_load(report)

    # ------------------------------------------------------------------ KV events
    async def _kv_loop(self) -> None:
        while True:
            try:
                await self._sync_kv_members()
                self._changed.clear()
                batches = await self._read_kv_until_changed()
                if batches is None:
                    continue  # membership changed: read again with the new member set
                for worker_id, streamed in batches:
                    if worker_id not in self._kv_positions:
                        continue
                    self._kv_positions[worker_id] = streamed.stream_id
                    if not self.view.kv_index.apply(streamed.batch):
                        await self._snapshot(worker_id)
                    else:
                        ms = int(streamed.stream_id.split(b"-")[0])
                        self.view.stats.kv_event_lag_s = max(
                            0.0, self.view.registry_time() - ms / 1000.0
                        )
            except ControlPlaneUnavailable as e:
                self._outage(e)
                await asyncio.sleep(0.5)

    async def _read_kv_until_changed(self) -> list[tuple[str, StreamedKVBatch]] | None:
        """The next KV batches, or None when the membership changes first."""
        read = asyncio.ensure_future(
            self.store.read_kv(dict(self._kv_positions), block_s=self._kv_block_s)
        )
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({read, changed}, return_when=asyncio.FIRST_COMPLETED)
            if read.done():
                return read.result()
            return None
        finally:
            for f in (read, changed):
                if not f.done():
                    f.cancel()
            await asyncio.gather(read, changed, return_exceptions=True)

    async def _sync_kv_members(self) -> None:
        members = {m.worker_id for m in self.view.members()}
        for gone in set(self._kv_positions) - members:
            del self._kv_positions[gone]
        for worker_id in members - set(self._kv_positions):
            # Where the stream ends now, then the snapshot: events between the two are in
            # both, and the index skips those the snapshot already counts (by sequence).
            self._kv_positions[worker_id] = await self.store.kv_stream_end(worker_id)
            await self._snapshot(worker_id)

    async def _snapshot(self, worker_id: str) -> None:
        info = self.view.member(worker_id)
        if info is None or self._snapshot_fn is None:
            return
        if self._snapshot_after.get(worker_id, 0.0) > time.monotonic():
            return  # a recent try failed: the worker's entries stay out of the index a while
        try:
            snapshot = await self._snapshot_fn(info)
        except Exception as e:  # the worker may be gone or busy: its entries wait
            logger.info("KV snapshot of %s failed: %s", worker_id, e)
            self.view.kv_index.remove_worker(worker_id)
            self._snapshot_after[worker_id] = time.monotonic() + 1.0
            return
        self._snapshot_after.pop(worker_id, None)
        if self.view.member(worker_id) is not None:
            self.view.kv_index.load_snapshot(snapshot)
            self.view.stats.kv_snapshots += 1
