"""Decode side, transport-independent: checks every message and says where its bytes go.

``ReceiverCore`` turns control messages into replies and a push into destination spans of the
pool; ``ReceiverBase`` adds the public ``KVReceiver`` methods and the lease reaper. A transport
subclasses ``ReceiverBase`` and only moves bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.block_hash import BlockHash
from engine.kv_cache_spec import KVCacheSpec
from kv_transfer.compatibility import compatibility_of, incompatibility
from kv_transfer.metrics import TransferMetrics
from kv_transfer.pool import PoolBuffer
from kv_transfer.reservations import (
    CompletedTransfer,
    PeerId,
    ReleaseReason,
    ReservationOwner,
    ReservationTable,
    WriteGrant,
)
from kv_transfer.ticket import ReservationTicket
from kv_transfer.wire import ack
from protos.pdserve.v1 import kv_transfer_pb2 as pb

DEFAULT_LEASE_S = 10.0  # prefill renews it every third while it works on a request

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushPlan:
    """Where an accepted push's bytes go: one writable span per segment, in payload order."""

    grant: WriteGrant
    spans: list[np.ndarray]


class _MeteredOwner:
    """Forwards to the real owner and counts outcomes."""

    def __init__(self, owner: ReservationOwner, metrics: TransferMetrics) -> None:
        self._owner = owner
        self._metrics = metrics

    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        self._metrics.record_transfer(result.seconds, result.num_bytes_received)
        self._owner.on_transfer_complete(result)

    def on_reservation_released(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        reason: ReleaseReason,
        num_intact_blocks: int,
    ) -> None:
        self._metrics.record_failure(reason.value)
        self._owner.on_reservation_released(request_id, block_ids, reason, num_intact_blocks)


class ReceiverCore:
    """Validation and bookkeeping of the decode side; no I/O."""

    def __init__(
        self,
        spec: KVCacheSpec,
        pool: Any,
        owner: ReservationOwner,
        metrics: TransferMetrics,
        default_lease_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.pool = PoolBuffer(spec, pool)
        self.metrics = metrics
        self.compatibility = compatibility_of(spec)
        self.table = ReservationTable(
            self.pool.num_blocks,
            _MeteredOwner(owner, metrics),
            spec.bytes_per_block,
            default_lease_s=default_lease_s,
            clock=clock,
        )

    def hello(self, hello: pb.KVHello) -> pb.KVHelloReply:
        error = incompatibility(self.compatibility, hello.compatibility)
        if error is not None:
            self.metrics.record_refused("KV_STATUS_INCOMPATIBLE")
            return pb.KVHelloReply(
                status=pb.KV_STATUS_INCOMPATIBLE, error=error, compatibility=self.compatibility
            )
        return pb.KVHelloReply(status=pb.KV_STATUS_OK, compatibility=self.compatibility)

    def begin_push(self, push: pb.KVPush, peer: PeerId) -> PushPlan | pb.KVAck:
        """A plan to receive the payload into, or the refusal to send back (the transport must
        then still consume ``push.payload_bytes`` so the connection stays in step)."""
        bpb = self.spec.bytes_per_block
        ids = list(push.block_ids)
        if push.payload_bytes != len(ids) * bpb:
            return self._refuse(
                pb.KV_STATUS_BAD_REQUEST,
                f"payload of {push.payload_bytes} bytes for {len(ids)} blocks of {bpb}",
            )
        if sum(push.segment_blocks) != len(ids) or any(n == 0 for n in push.segment_blocks):
            return self._refuse(pb.KV_STATUS_BAD_REQUEST, "segments do not cover the blocks")
        segments: list[tuple[int, int]] = []
        k = 0
        for n in push.segment_blocks:
            run = ids[k : k + n]
            if run != list(range(run[0], run[0] + n)):
                return self._refuse(pb.KV_STATUS_BAD_REQUEST, f"segment {run} not contiguous")
            segments.append((run[0], n))
            k += n
        grant = self.table.begin_write(
            push.request_id,
            push.token,
            list(push.block_indices),
            ids,
            peer,
            is_last=push.is_last,
            first_token_id=push.first_token_id,
            first_token_logprob=push.first_token_logprob,
        )
        if isinstance(grant, tuple):
            status, message = grant
            return self._refuse(pb.KVStatus.Value(status.value), message)
        return PushPlan(grant, [self.pool.numpy_span(first, n) for first, n in segments])

    def end_push(self, plan: PushPlan, ok: bool) -> pb.KVAck:
        status, missing = self.table.end_write(plan.grant, ok)
        if ok:
            self.metrics.record_blocks(
                len(plan.grant.block_ids), len(plan.grant.block_ids) * self.spec.bytes_per_block
            )
        code = pb.KVStatus.Value(status.value)
        if code == pb.KV_STATUS_UNKNOWN_RESERVATION:
            self.metrics.record_refused(status.value)
            return ack(code, f"reservation {plan.grant.request_id!r} released during the write")
        if code == pb.KV_STATUS_INCOMPLETE:
            return ack(code, f"{missing} expected blocks never arrived", missing)
        return ack(code)

    def renew(self, renew: pb.KVRenew, peer: PeerId) -> pb.KVAck:
        if self.table.renew(renew.request_id, renew.token, peer):
            return ack(pb.KV_STATUS_OK)
        return self._refuse(pb.KV_STATUS_UNKNOWN_RESERVATION, f"cannot renew {renew.request_id!r}")

    def abort(self, abort: pb.KVAbort) -> pb.KVAck:
        # Idempotent: aborting a reservation that is already gone is not an error.
        self.table.abort(abort.request_id, abort.token)
        return ack(pb.KV_STATUS_OK)

    def _refuse(self, status: int, message: str) -> pb.KVAck:
        self.metrics.record_refused(pb.KVStatus.Name(status))  # type: ignore[arg-type]
        return ack(status, message)


class ReceiverBase:
    """The public decode-side API (see ``KVReceiver``), shared by every transport."""

    scheme = ""

    def __init__(
        self,
        spec: KVCacheSpec,
        pool: Any,
        owner: ReservationOwner,
        metrics: TransferMetrics | None = None,
        default_lease_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics or TransferMetrics()
        self.core = ReceiverCore(spec, pool, owner, self._metrics, default_lease_s, clock)
        self._clock = clock
        self._endpoint = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._reaper: asyncio.Task[None] | None = None

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def metrics(self) -> TransferMetrics:
        return self._metrics

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await self._start_transport()
        self._reaper = asyncio.create_task(self._reap())

    def reserve(
        self,
        request_id: str,
        block_ids: Sequence[int],
        cached_blocks: Mapping[int, BlockHash] | None = None,
        lease_s: float | None = None,
    ) -> ReservationTicket:
        if not self._endpoint:
            raise RuntimeError("start() the receiver before reserving: it has no endpoint yet")
        token, lease = self.core.table.reserve(request_id, block_ids, cached_blocks, lease_s)
        self._poke_reaper()
        return ReservationTicket(
            request_id=request_id,
            endpoint=self.endpoint,
            token=token,
            block_ids=tuple(block_ids),
            cached_blocks=dict(cached_blocks or {}),
            lease_s=lease,
            compatibility=self.core.compatibility,
        )

    def renew(self, request_id: str) -> bool:
        return self.core.table.renew(request_id)

    def abort(self, request_id: str) -> bool:
        return self.core.table.abort(request_id)

    def check_integrity(self) -> None:
        self.core.table.check_integrity()

    def num_reservations(self) -> int:
        return len(self.core.table)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        # Release first (reason CLOSED): writes still in flight are then cut by the transport
        # closing, and each release completes when its last write has stopped.
        self.core.table.release_all(ReleaseReason.CLOSED)
        await self._close_transport()

    # -- for transports -----------------------------------------------------------------------

    async def _start_transport(self) -> None:
        raise NotImplementedError

    async def _close_transport(self) -> None:
        raise NotImplementedError

    def _cut_peer(self, peer: PeerId) -> None:
        """Stop every write in flight from ``peer`` (its reservation expired under it)."""
        raise NotImplementedError

    def _poke_reaper(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    async def _reap(self) -> None:
        assert self._wake is not None
        while True:
            try:
                for peer in self.core.table.expire():
                    _log.warning("KV peer %s cut: a write outlived its lease", peer)
                    self._cut_peer(peer)
            except Exception:  # an owner callback broke its contract: keep reaping
                _log.exception("lease reaper")
            deadline = self.core.table.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self._clock()) + 0.001
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
