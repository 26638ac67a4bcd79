"""``DecodeWorker`` servicer: reserve blocks, receive the prompt's KV, stream tokens.

Ownership of a remote-prefill request's blocks, step by step:

    reserve_remote_prefill (engine)  ──▶ receiver.reserve (kv_transfer)  ──▶ ticket to router
          │                                   │
          │        transfer complete ◀────────┘── on_transfer_complete: engine admits, streams
          └──── released (abort, lease expiry, peer lost, stream cancelled)
                   on_reservation_released: engine frees the blocks — only then, because the
                   receiver guarantees no write to them is still in flight.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator

import grpc

from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.metrics import LATENCY_BUCKETS_S, Histogram
from engine.outputs import RemotePrefillReservation, RequestOutput
from kv_transfer import CompletedTransfer, ReleaseReason
from kv_transfer.receiver import ReceiverBase
from pdserve.wire import delta_to_proto, sampling_params_from_proto
from pdserve.worker_process import integrity_error
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc

logger = logging.getLogger(__name__)

TRANSFER_TIMEOUT_S = 120.0


class _Waiter:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[CompletedTransfer | ReleaseReason] = loop.create_future()
        self.completed = False  # set by the receiver's thread before the future settles

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
            waiter.completed = True  # from here on the stream owns the blocks
            waiter.settle(result)
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
        self, engine: AsyncEngine, receiver: ReceiverBase, owner: DecodeOwner, transport: str
    ) -> None:
        self._engine = engine
        self._receiver = receiver
        self._owner = owner
        self._transport = transport
        owner.engine = engine
        # TTFT stage "decode_admission": all KV arrived -> first token sent to the router.
        self.admission_seconds = Histogram(LATENCY_BUCKETS_S)

    async def Generate(
        self, request: wpb.WorkerGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[wpb.DecodeMessage]:
        rid = request.request_id
        try:
            params = sampling_params_from_proto(request.sampling_params)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        ids = list(request.prompt_token_ids)
        threshold = request.local_prefill_max_tokens
        if threshold < 0 or (threshold > 0 and len(ids) <= threshold):
            stream = self._engine.generate(
                rid, prompt_token_ids=ids, sampling_params=params, priority=request.priority
            )
            try:
                first = await anext(stream)
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            yield wpb.DecodeMessage(local_prefill=True)
            yield wpb.DecodeMessage(output=delta_to_proto(first))
            async for out in stream:
                yield wpb.DecodeMessage(output=delta_to_proto(out))
            return

        def reserve(e: LLMEngine) -> RemotePrefillReservation | None:
            return e.reserve_remote_prefill(
                rid, prompt_token_ids=ids, sampling_params=params, priority=request.priority
            )

        try:
            reservation = await self._engine.call(reserve)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if reservation is None:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "no free KV blocks for this prompt now"
            )
            return
        waiter = _Waiter(asyncio.get_running_loop())
        self._owner.expect(rid, waiter)
        reserved = False
        admitted = False
        try:
            ticket = self._receiver.reserve(rid, reservation.block_ids, reservation.cached_blocks)
            reserved = True
            yield wpb.DecodeMessage(reservation=ticket.to_proto())
            result = await asyncio.wait_for(waiter.future, TRANSFER_TIMEOUT_S)
            if isinstance(result, ReleaseReason):
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"KV transfer for {rid} ended before completion: {result.value}",
                )
            assert isinstance(result, CompletedTransfer)
            first_id, first_lp = result.first_token_id, result.first_token_logprob

            def admit(e: LLMEngine) -> list[RequestOutput]:
                return [e.admit_remote_prefill(rid, first_id, first_lp)]

            admitted = True
            arrived = time.monotonic()
            async for out in self._engine.attach(rid, admit):
                if arrived:
                    self.admission_seconds.observe(time.monotonic() - arrived)
                    arrived = 0.0
                yield wpb.DecodeMessage(output=delta_to_proto(out))
        finally:
            self._owner.forget(rid)  # a completion after this frees the blocks itself
            if not admitted:
                if reserved and not waiter.completed:
                    # The receiver releases (at once, or once an in-flight write stops) and
                    # its callback frees the blocks.
                    self._receiver.abort(rid)
                else:
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
            num_reservations=self._receiver.num_reservations(),
        )
        if request.check_integrity:
            load.integrity_checked = True
            load.integrity_error = await integrity_error(
                self._engine, self._receiver.core.table.check_integrity
            )
        return load
