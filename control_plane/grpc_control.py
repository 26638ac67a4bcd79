"""The ``WorkerControl`` gRPC service (protos/pdserve/v1/control.proto): the worker's side that
answers, and the router's client that asks. Plain dataclasses on both ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from control_plane.kv_events import KVEventBatch, KVEventLog, KVSnapshot
from control_plane.load_report import LoadReport
from control_plane.worker_agent import LoadSample
from control_plane.worker_info import ModelFingerprint, WorkerInfo, WorkerState
from engine.block_hash import HASH_BYTES, BlockHash
from protos.pdserve.v1 import control_pb2 as cpb
from protos.pdserve.v1 import control_pb2_grpc


def info_to_proto(info: WorkerInfo) -> cpb.WorkerInfoReply:
    fp = info.fingerprint
    return cpb.WorkerInfoReply(
        worker_id=info.worker_id,
        role=info.role,
        epoch=info.epoch,
        grpc_address=info.grpc_address,
        kv_endpoint=info.kv_endpoint,
        transport=info.transport,
        state=info.state.value,
        model=fp.model,
        architecture=fp.architecture,
        dtype=fp.dtype,
        block_size=fp.block_size,
        num_layers=fp.num_layers,
        num_kv_heads=fp.num_kv_heads,
        head_dim=fp.head_dim,
        num_blocks=info.num_blocks,
    )


def info_from_proto(m: cpb.WorkerInfoReply) -> WorkerInfo:
    if m.role not in ("prefill", "decode"):
        raise ValueError(f"role: unknown role {m.role!r}")
    return WorkerInfo(
        worker_id=m.worker_id,
        role=m.role,  # type: ignore[arg-type]
        grpc_address=m.grpc_address,
        fingerprint=ModelFingerprint(
            m.model,
            m.architecture,
            m.dtype,
            m.block_size,
            m.num_layers,
            m.num_kv_heads,
            m.head_dim,
        ),
        num_blocks=m.num_blocks,
        epoch=m.epoch,
        kv_endpoint=m.kv_endpoint,
        transport=m.transport,
        state=WorkerState(m.state or "serving"),
    )


class WorkerControlService(control_pb2_grpc.WorkerControlServicer):
    """The worker side. ``info()`` and ``sample_load()`` are read at each call (state and
    epoch change while the worker runs); ``kv_log`` is None when prefix caching is off."""

    def __init__(
        self,
        info: Callable[[], WorkerInfo],
        sample_load: Callable[[], LoadSample],
        kv_log: KVEventLog | None,
    ) -> None:
        self._info = info
        self._sample_load = sample_load
        self._kv_log = kv_log
        self._seq = 0

    async def GetWorkerInfo(
        self, request: cpb.GetWorkerInfoRequest, context: grpc.aio.ServicerContext
    ) -> cpb.WorkerInfoReply:
        return info_to_proto(self._info())

    async def GetLoadReport(
        self, request: cpb.GetLoadReportRequest, context: grpc.aio.ServicerContext
    ) -> cpb.LoadReply:
        s = self._sample_load()
        self._seq += 1
        return cpb.LoadReply(
            epoch=self._info().epoch,
            seq=self._seq,
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            num_running_requests=s.num_running_requests,
            num_waiting_requests=s.num_waiting_requests,
            num_queued_prefill_tokens=s.num_queued_prefill_tokens,
            step_time_s=s.step_time_s,
        )

    async def GetKVSnapshot(
        self, request: cpb.GetKVSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> cpb.KVSnapshotReply:
        info = self._info()
        if self._kv_log is None:
            return cpb.KVSnapshotReply(worker_id=info.worker_id, generation=info.epoch)
        snap = self._kv_log.snapshot()
        return cpb.KVSnapshotReply(
            worker_id=snap.worker_id,
            generation=snap.generation,
            last_seq=snap.last_seq,
            block_hashes=b"".join(sorted(snap.block_hashes)),
        )

    async def GetKVEvents(
        self, request: cpb.GetKVEventsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.KVEventsReply:
        if self._kv_log is None:
            return cpb.KVEventsReply(generation=self._info().epoch)
        if request.generation != self._kv_log.generation:
            return cpb.KVEventsReply(snapshot_needed=True, generation=self._kv_log.generation)
        batch = self._kv_log.since(request.after_seq)
        if batch is None:
            return cpb.KVEventsReply(snapshot_needed=True, generation=self._kv_log.generation)
        return cpb.KVEventsReply(
            generation=batch.generation, first_seq=batch.first_seq, events=batch.encode_events()
        )


class WorkerControlClient:
    """The router side, over one worker's channel. Every call has a deadline."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 2.0) -> None:
        self._stub: Any = control_pb2_grpc.WorkerControlStub(channel)
        self._timeout_s = timeout_s

    async def info(self) -> WorkerInfo:
        reply = await self._stub.GetWorkerInfo(cpb.GetWorkerInfoRequest(), timeout=self._timeout_s)
        return info_from_proto(reply)

    async def load(self, worker_id: str, timestamp: float) -> LoadReport:
        """The worker's load now, stamped ``timestamp`` (the router's registry clock)."""
        m = await self._stub.GetLoadReport(cpb.GetLoadReportRequest(), timeout=self._timeout_s)
        return LoadReport(
            worker_id=worker_id,
            epoch=m.epoch,
            seq=m.seq,
            timestamp=timestamp,
            num_blocks=m.num_blocks,
            num_free_blocks=m.num_free_blocks,
            num_running_requests=m.num_running_requests,
            num_waiting_requests=m.num_waiting_requests,
            num_queued_prefill_tokens=m.num_queued_prefill_tokens,
            step_time_s=m.step_time_s,
        )

    async def snapshot(self) -> KVSnapshot:
        m = await self._stub.GetKVSnapshot(cpb.GetKVSnapshotRequest(), timeout=self._timeout_s)
        raw = bytes(m.block_hashes)
        if len(raw) % HASH_BYTES:
            raise ValueError("block_hashes: not a whole number of hashes")
        hashes = frozenset(
            BlockHash(raw[i : i + HASH_BYTES]) for i in range(0, len(raw), HASH_BYTES)
        )
        return KVSnapshot(m.worker_id, m.generation, m.last_seq, hashes)

    async def events(self, worker_id: str, generation: int, after_seq: int) -> KVEventBatch | None:
        """Events after ``after_seq``, or None when a snapshot is needed."""
        m = await self._stub.GetKVEvents(
            cpb.GetKVEventsRequest(generation=generation, after_seq=after_seq),
            timeout=self._timeout_s,
        )
        if m.snapshot_needed:
            return None
        return KVEventBatch(
            worker_id, m.generation, m.first_seq, KVEventBatch.decode_events(bytes(m.events))
        )
