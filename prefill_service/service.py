"""``PrefillWorker`` servicer: a thin gRPC shell around an engine whose KV connector exports.

    Prefill(ticket) ─▶ sender.open(ticket) ─▶ connector.start_job ─▶ engine.generate(export)
                       the engine runs chunked prefill; after every step the connector pushes
                       the blocks that step completed (see kv_transfer.prefill_connector)
                    ◀─ first token, once decode holds every block

An exporting request takes its whole prompt's blocks at admission and is never preempted (a
scheduler rule), and its blocks are freed only once the transfer no longer reads them. While
the request waits and computes, the connector renews decode's lease. A draining worker still
takes prefills (each is for a request the cluster started: decode holds its blocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

import grpc

from engine.async_engine import AsyncEngine
from engine.kv_connector.params import KVTransferParams
from engine.metrics import LATENCY_BUCKETS_S, Histogram
from engine.outputs import RequestOutput
from kv_transfer import KVSender, KVTransferError, ReservationTicket
from kv_transfer.errors import IncompatiblePeerError, PeerNotAllowedError
from kv_transfer.prefill_connector import EngineStalledError, PrefillConnector
from pdserve.wire import resume_from_proto, sampling_params_from_proto
from pdserve.worker_process import Drain, RequestFailed, integrity_error
from protos.pdserve.v1 import generate_pb2 as gpb
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc


async def _last_output(stream: AsyncGenerator[RequestOutput, None]) -> RequestOutput:
    last: RequestOutput | None = None
    async with contextlib.aclosing(stream):
        async for out in stream:
            last = out
    if last is None or last.finish_reason not in ("length", "stop"):
        raise RuntimeError(f"prefill ended with {last.finish_reason if last else 'nothing'}")
    return last


class PrefillWorkerService(worker_pb2_grpc.PrefillWorkerServicer):
    def __init__(self, engine: AsyncEngine, connector: PrefillConnector, sender: KVSender) -> None:
        self._engine = engine
        self._connector = connector
        self._sender = sender
        self._queued_tokens = 0
        # A draining prefill worker still takes prefills: each is for a request the cluster
        # has started (decode holds its blocks). Routers stop sending new ones (GetLoad).
        self.drain = Drain("prefill worker")
        # TTFT stage "kv_transfer": first token sampled -> decode acknowledged the last blocks.
        self.kv_transfer_seconds = Histogram(LATENCY_BUCKETS_S)

    async def Prefill(
        self, request: wpb.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> wpb.PrefillResponse:
        async with self.drain.serving(request.request_id, context, admit_while_draining=True):
            response = await self._prefill(request, context)
        return response

    async def _prefill(
        self, request: wpb.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> wpb.PrefillResponse:
        started = time.monotonic()
        rid = request.request_id
        ids = list(request.prompt_token_ids)
        try:
            params = sampling_params_from_proto(request.sampling_params)
            resume = resume_from_proto(request.HasField("resume"), request.resume)
        except ValueError as e:
            raise RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
        ticket = ReservationTicket.from_proto(request.reservation)
        try:
            transfer = await self._sender.open(ticket)
        except IncompatiblePeerError as e:
            raise RequestFailed(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from e
        except PeerNotAllowedError as e:
            raise RequestFailed(grpc.StatusCode.PERMISSION_DENIED, str(e)) from e
        except KVTransferError as e:
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, f"KV transfer: {e}") from e
        done = self._connector.start_job(rid, transfer)
        stream = self._engine.generate(
            rid,
            prompt_token_ids=ids,
            sampling_params=params,
            priority=request.priority,
            kv_transfer=KVTransferParams("export"),
            resume=resume,
        )
        final_task = asyncio.ensure_future(_last_output(stream))
        self._queued_tokens += len(ids)
        try:
            # Either may fail first: the engine (bad prompt) or the transfer (decode gone).
            waiting: set[asyncio.Future[Any]] = {final_task, done}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_EXCEPTION)
            if done.done() and not final_task.done():
                await done  # the transfer failed: answer now, and stop computing the prompt
            final = await final_task
            prompt_done = time.monotonic()
            await done
            self.kv_transfer_seconds.observe(time.monotonic() - prompt_done)
        except ValueError as e:
            raise RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
        except (KVTransferError, EngineStalledError, asyncio.CancelledError) as e:
            if isinstance(e, asyncio.CancelledError) and not done.cancelled():
                raise  # this call was cancelled (the router went away)
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, f"KV transfer: {e}") from e
        finally:
            self._queued_tokens -= len(ids)
            self._connector.cancel_job(rid)  # no-op once the transfer finished
            if not final_task.done():
                final_task.cancel()  # closing the stream aborts the engine request
                await asyncio.gather(final_task, return_exceptions=True)
        first = final.new_logprobs[0] if final.new_logprobs else None
        top = first.top_logprobs if first is not None else ()
        return wpb.PrefillResponse(
            first_token_id=final.token_ids[0],
            first_token_logprob=first.logprob if first and first.logprob is not None else 0.0,
            num_cached_tokens=final.num_cached_tokens,
            num_blocks_sent=len(ticket.expected_block_indices),
            num_blocks_skipped=len(ticket.cached_blocks),
            prefill_seconds=time.monotonic() - started,
            first_token_top_logprobs=[gpb.TopLogprob(token_id=t, logprob=lp) for t, lp in top],
        )

    @property
    def num_queued_tokens(self) -> int:
        """Prompt tokens of the prefills this worker holds (queued or computing)."""
        return self._queued_tokens

    async def GetLoad(
        self, request: wpb.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> wpb.WorkerLoad:
        s = self._engine.stats
        load = wpb.WorkerLoad(
            role="prefill",
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            num_running_requests=s.num_running,
            num_waiting_requests=s.num_waiting,
            num_queued_prefill_tokens=self._queued_tokens,
            num_reservations=self._sender.num_active_transfers,
            draining=self.drain.is_draining,
        )
        if request.check_integrity:
            load.integrity_checked = True
            load.integrity_error = await integrity_error(self._engine)
        return load
