"""``DecodeWorker`` servicer: a thin gRPC shell around an engine whose KV connector imports.

    Generate ─▶ engine.generate(import) ─▶ the scheduler queues the request until it has the
                prompt's blocks (never refused for lack of room), the connector reserves them
                in the KV receiver ─▶ first message: the reservation ticket (to the router,
                then a prefill worker) ─▶ the KV arrives ─▶ the request runs from the first
                token sampled on prefill ─▶ token deltas

Short prompts may be prefilled here (``local_prefill_max_tokens``): first message
``local_prefill``. A migrated request (``resume`` set) continues from the earlier outputs at
the end of its prompt ids (engine.resume). While a stream has nothing to send (queued for
blocks, waiting for its KV, preempted) it sends a heartbeat every ``heartbeat_s``, so the
router tells a long queue from a stalled worker. Cancelling the stream aborts the request
wherever it is; blocks are freed once no write can touch them (kv_transfer.decode_connector).
A request id is served by one stream
at a time (a second gets INVALID_ARGUMENT), and a draining worker refuses new requests with
UNAVAILABLE (pdserve.worker_process.Drain).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from decode_service.heartbeat import HEARTBEAT_S, HeartbeatWriter
from engine.async_engine import AsyncEngine, EngineShutdownError
from engine.kv_connector.params import KVTransferParams
from engine.metrics import LATENCY_BUCKETS_S, Histogram
from engine.outputs import RequestOutput
from engine.resume import ResumeState
from engine.sampling_params import SamplingParams
from kv_transfer.decode_connector import DecodeConnector
from kv_transfer.transport import KVReceiver
from pdserve.wire import delta_to_proto, resume_from_proto, sampling_params_from_proto
from pdserve.worker_process import Drain, RequestFailed, integrity_error
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc

_HEARTBEAT = wpb.DecodeMessage(heartbeat=True)


class DecodeWorkerService(worker_pb2_grpc.DecodeWorkerServicer):
    def __init__(
        self,
        engine: AsyncEngine,
        connector: DecodeConnector,
        receiver: KVReceiver,
        transport: str,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self._engine = engine
        self._connector = connector
        self._receiver = receiver
        self._transport = transport
        self._heartbeat_s = heartbeat_s
        self.drain = Drain("decode worker")
        # TTFT stage "decode_admission": ticket sent -> first token sent to the router.
        self.admission_seconds = Histogram(LATENCY_BUCKETS_S)

    async def Generate(
        self, request: wpb.WorkerGenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:  # type: ignore[override]
        rid = request.request_id
        try:
            params = sampling_params_from_proto(request.sampling_params)
            resume = resume_from_proto(request.HasField("resume"), request.resume)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        async with self.drain.serving(rid, context):
            async with HeartbeatWriter(
                context.write, _HEARTBEAT, self._heartbeat_s, lambda: self._engine.is_running
            ) as out:
                try:
                    await self._generate(rid, request, params, resume, context, out)
                except EngineShutdownError as e:
                    raise RequestFailed(grpc.StatusCode.UNAVAILABLE, f"decode worker: {e}") from e

    async def _generate(
        self,
        rid: str,
        request: wpb.WorkerGenerateRequest,
        params: SamplingParams,
        resume: ResumeState | None,
        context: grpc.aio.ServicerContext,
        out: HeartbeatWriter,
    ) -> None:
        ids = list(request.prompt_token_ids)
        threshold = request.local_prefill_max_tokens
        local = threshold < 0 or (threshold > 0 and len(ids) <= threshold)
        ticket = None if local else self._connector.expect_ticket(rid)
        stream = self._engine.generate(
            rid,
            prompt_token_ids=ids,
            sampling_params=params,
            priority=request.priority,
            kv_transfer=None if local else KVTransferParams("import"),
            resume=resume,
        )
        first = asyncio.ensure_future(anext(stream))  # submits the request to the engine
        ticketed = 0.0
        try:
            if ticket is None:
                await out.write(wpb.DecodeMessage(local_prefill=True))
            else:
                waiting: set[asyncio.Future[Any]] = {ticket, first}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if ticket.done() and ticket.exception() is None:
                    await out.write(wpb.DecodeMessage(reservation=ticket.result().to_proto()))
                    ticketed = time.monotonic()
            try:
                o: RequestOutput = await first
            except ValueError as e:
                raise RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
            except StopAsyncIteration:
                ended = "the engine ended the stream"
                raise RequestFailed(grpc.StatusCode.INTERNAL, ended) from None
            if ticketed:
                self.admission_seconds.observe(time.monotonic() - ticketed)
            while True:
                if o.finish_reason == "error":
                    raise RequestFailed(
                        grpc.StatusCode.UNAVAILABLE, o.error or f"request {rid} failed"
                    )
                await out.write(wpb.DecodeMessage(output=delta_to_proto(o)))
                if o.finished:
                    return
                o = await anext(stream)
        finally:
            self._connector.forget(rid)
            if not first.done():
                first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await stream.aclose()  # aborts the request unless it finished

    async def GetLoad(
        self, request: wpb.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> wpb.WorkerLoad:
        s = self._engine.stats
        load = wpb.WorkerLoad(
            role="decode",
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            num_running_requests=s.num_running + s.num_swapped,
            num_waiting_requests=s.num_waiting + s.num_waiting_for_remote_kv,
            kv_endpoint=self._receiver.endpoint,
            transport=self._transport,
            num_reservations=self._receiver.num_reservations() + s.num_waiting,
            draining=self.drain.is_draining,
        )
        if request.check_integrity:
            load.integrity_checked = True
            load.integrity_error = await integrity_error(self._engine, self._check_receiver)
        return load

    def _check_receiver(self) -> None:
        self._receiver.check_integrity()
