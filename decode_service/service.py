"""``DecodeWorker`` servicer: reserve blocks, receive the prompt's KV, stream tokens.

Ownership of a remote-prefill request's blocks, step by step (one owner at every moment):

    block queue (waits for room) ──▶ engine reservation ──▶ receiver.reserve ──▶ ticket out
                                       (engine._remote)       (kv_transfer)
          transfer complete ◀──────────────────────────────────┘── on_transfer_complete:
          (the stream admits it: running batch, tokens out)         the stream owns them
          released (abort, lease expiry, peer lost, stream gone): on_reservation_released
          frees the blocks — only then, because the receiver guarantees no write to them is
          still in flight.

Whatever ends the stream (finish, the router's cancel, an error, shutdown), its ``finally``
gives the request up exactly once: ``receiver.discard`` when the receiver holds the
reservation (its release callback frees the blocks), else ``engine.abort``, which the engine
thread runs after any reservation it made for the request.

A request id is served by one stream at a time on this worker; a second gets
INVALID_ARGUMENT, so no cleanup ever touches another stream's request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import aclosing

import grpc

from decode_service.block_queue import BlockQueue
from decode_service.heartbeat import HEARTBEAT_S, HeartbeatWriter
from engine.async_engine import AsyncEngine, EngineShutdownError
from engine.llm_engine import LLMEngine
from engine.metrics import LATENCY_BUCKETS_S, Histogram
from engine.outputs import RemotePrefillReservation, RequestOutput
from engine.sampling_params import SamplingParams
from kv_transfer import CompletedTransfer, ReleaseReason
from kv_transfer.receiver import ReceiverBase
from pdserve.wire import delta_to_proto, sampling_params_from_proto
from pdserve.worker_process import Drain, integrity_error
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc

logger = logging.getLogger(__name__)

_HEARTBEAT = wpb.DecodeMessage(heartbeat=True)


class _Waiter:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[CompletedTransfer | ReleaseReason] = loop.create_future()

    def settle(self, value: CompletedTransfer | ReleaseReason) -> None:
        def _set() -> None:
            if not self.future.done():
                self.future.set_result(value)

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:  # loop closed: the stream is gone already
            pass


class DecodeOwner:
    """The ``kv_transfer.ReservationOwner`` of the decode worker: routes the receiver's
    callbacks (any thread) to the request's waiting stream and frees released blocks."""

    def __init__(self) -> None:
        self.engine: AsyncEngine | None = None
        self._lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}

    def expect(self, request_id: str, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters[request_id] = waiter

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._waiters.pop(request_id, None)

    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        with self._lock:
            waiter = self._waiters.pop(result.request_id, None)
        if waiter is not None:
            waiter.settle(result)  # the stream admits it, or aborts it if it is gone by then
        elif self.engine is not None:  # nobody waits any more: give the blocks back
            self.engine.abort(result.request_id)

    def on_reservation_released(
        self, request_id: str, block_ids: tuple[int, ...], reason: ReleaseReason
    ) -> None:
        if self.engine is not None:
            self.engine.abort(request_id)  # frees the reserved blocks in the engine thread
        with self._lock:
            waiter = self._waiters.pop(request_id, None)
        if waiter is not None:
            waiter.settle(reason)


class DecodeWorkerService(worker_pb2_grpc.DecodeWorkerServicer):
    def __init__(
        self,
        engine: AsyncEngine,
        receiver: ReceiverBase,
        owner: DecodeOwner,
        transport: str,
        blocks: BlockQueue | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        """``blocks``: the queue the engine's ``on_step`` hook serves (see block_queue)."""
        self._engine = engine
        self._receiver = receiver
        self._owner = owner
        self._transport = transport
        self._blocks = blocks if blocks is not None else BlockQueue()
        self._heartbeat_s = heartbeat_s
        self.drain = Drain("decode worker")
        owner.engine = engine
        # TTFT stage "decode_admission": all KV arrived -> first token sent to the router.
        self.admission_seconds = Histogram(LATENCY_BUCKETS_S)

    async def Generate(
        self, request: wpb.WorkerGenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:  # type: ignore[override]
        rid = request.request_id
        try:
            params = sampling_params_from_proto(request.sampling_params)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        async with self.drain.serving(rid, context):
            async with HeartbeatWriter(
                context.write, _HEARTBEAT, self._heartbeat_s, lambda: self._engine.is_running
            ) as out:
                try:
                    threshold = request.local_prefill_max_tokens
                    ids = list(request.prompt_token_ids)
                    if threshold < 0 or (threshold > 0 and len(ids) <= threshold):
                        await self._local(rid, ids, params, request.priority, context, out)
                    else:
                        await self._remote(rid, ids, params, request.priority, context, out)
                except EngineShutdownError as e:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"decode worker: {e}")

    async def _local(
        self,
        rid: str,
        ids: list[int],
        params: SamplingParams,
        priority: int,
        context: grpc.aio.ServicerContext,
        out: HeartbeatWriter,
    ) -> None:
        """Prefill on this worker (a short prompt): no reservation, no transfer."""
        stream = self._engine.generate(
            rid, prompt_token_ids=ids, sampling_params=params, priority=priority
        )
        async with aclosing(stream):  # leaving early aborts the request at once
            try:
                first = await anext(stream)
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            await out.write(wpb.DecodeMessage(local_prefill=True))
            await out.write(_output(first))
            async for o in stream:
                await out.write(_output(o))

    async def _remote(
        self,
        rid: str,
        ids: list[int],
        params: SamplingParams,
        priority: int,
        context: grpc.aio.ServicerContext,
        out: HeartbeatWriter,
    ) -> None:
        """Reserve blocks (waiting for room), hand out the ticket, wait for the KV, decode."""

        def reserve(e: LLMEngine) -> RemotePrefillReservation | None:
            return e.reserve_remote_prefill(
                rid, prompt_token_ids=ids, sampling_params=params, priority=priority
            )

        waiter = _Waiter(asyncio.get_running_loop())
        admitted = False
        try:
            try:
                reservation = await self._blocks.reserve(self._engine, rid, reserve)
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            self._owner.expect(rid, waiter)
            ticket = self._receiver.reserve(rid, reservation.block_ids, reservation.cached_blocks)
            await out.write(wpb.DecodeMessage(reservation=ticket.to_proto()))
            # No deadline of its own: the lease is one (prefill renews it while it works on
            # the request), and heartbeats tell the router this worker still waits.
            result = await waiter.future
            if isinstance(result, ReleaseReason):
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, _released(rid, result, ticket.lease_s)
                )
            assert isinstance(result, CompletedTransfer)
            first_id, first_lp = result.first_token_id, result.first_token_logprob

            def admit(e: LLMEngine) -> list[RequestOutput]:
                return [e.admit_remote_prefill(rid, first_id, first_lp)]

            admitted = True  # from here on the engine stream owns the request (attach aborts)
            arrived = time.monotonic()
            async with aclosing(self._engine.attach(rid, admit)) as stream:
                async for o in stream:
                    if arrived:
                        self.admission_seconds.observe(time.monotonic() - arrived)
                        arrived = 0.0
                    await out.write(_output(o))
        finally:
            self._owner.forget(rid)
            if not admitted and not self._receiver.discard(rid):
                self._engine.abort(rid)

    async def GetLoad(
        self, request: wpb.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> wpb.WorkerLoad:
        s = self._engine.stats
        load = wpb.WorkerLoad(
            role="decode",
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            num_running_requests=s.num_running + s.num_swapped,
            num_waiting_requests=s.num_waiting,
            kv_endpoint=self._receiver.endpoint,
            transport=self._transport,
            num_reservations=self._receiver.num_reservations() + len(self._blocks),
            draining=self.drain.is_draining,
        )
        if request.check_integrity:
            load.integrity_checked = True
            load.integrity_error = await integrity_error(
                self._engine, self._receiver.core.table.check_integrity
            )
        return load


def _output(out: RequestOutput) -> wpb.DecodeMessage:
    return wpb.DecodeMessage(output=delta_to_proto(out))


def _released(request_id: str, reason: ReleaseReason, lease_s: float) -> str:
    why = {
        ReleaseReason.EXPIRED: f"the prefill worker neither sent KV nor renewed the lease "
        f"for {lease_s:g}s",
        ReleaseReason.PEER_LOST: "the connection to the prefill worker was lost",
        ReleaseReason.ABORTED: "the prefill worker aborted it",
        ReleaseReason.CLOSED: "the decode worker is shutting down",
    }[reason]
    return f"KV transfer for {request_id} ended before completion ({reason.value}): {why}"
