"""``PrefillWorker`` servicer: chunked prefill whose finished blocks are pushed to the decode
worker's reservation after every chunk, so the transfer overlaps the next chunk's compute.

    engine thread: step ─▶ on_step hook drains PrefillProgress ─▶ (call_soon_threadsafe)
    event loop:    Prefill() ─▶ push(full blocks of this chunk) ... finish(last blocks, token)
                   ─▶ release_kv: the request's blocks go back to the pool

A prefill request takes all its prompt blocks at admission and is never preempted (see the
scheduler), so a block being read by a transfer is never reused under it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import grpc

from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.metrics import LATENCY_BUCKETS_S, Histogram
from engine.outputs import PrefillProgress, RequestOutput
from kv_transfer import KVSender, KVTransferError, ReservationTicket
from kv_transfer.errors import IncompatiblePeerError
from pdserve.wire import sampling_params_from_proto
from pdserve.worker_process import Drain, integrity_error
from prefill_service.lease import keep_alive
from protos.pdserve.v1 import generate_pb2 as gpb
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc

logger = logging.getLogger(__name__)


class ProgressRouter:
    """Hands the engine thread's ``PrefillProgress`` to the coroutine serving each request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[
            str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[PrefillProgress]]
        ] = {}

    def register(self, request_id: str) -> asyncio.Queue[PrefillProgress]:
        queue: asyncio.Queue[PrefillProgress] = asyncio.Queue()
        with self._lock:
            self._queues[request_id] = (asyncio.get_running_loop(), queue)
        return queue

    def unregister(self, request_id: str) -> None:
        with self._lock:
            self._queues.pop(request_id, None)

    def on_step(self, engine: LLMEngine) -> None:
        """AsyncEngine's hook: runs on the engine thread after every step."""
        for progress in engine.take_prefill_progress():
            with self._lock:
                entry = self._queues.get(progress.request_id)
            if entry is None:
                continue
            loop, queue = entry
            try:
                loop.call_soon_threadsafe(queue.put_nowait, progress)
            except RuntimeError:
                pass


async def _last_output(stream: AsyncGenerator[RequestOutput, None]) -> RequestOutput:
    last: RequestOutput | None = None
    async with aclosing(stream):
        async for out in stream:
            last = out
    if last is None or last.finish_reason not in ("length", "stop"):
        raise RuntimeError(f"prefill ended with {last.finish_reason if last else 'nothing'}")
    return last


async def _next_progress(
    queue: asyncio.Queue[PrefillProgress],
    final_task: asyncio.Future[RequestOutput],
    lease: asyncio.Future[None],
) -> PrefillProgress:
    """The next progress report; re-raises at once if the engine side failed first or the
    lease could not be kept (decode released the reservation)."""
    if not queue.empty():
        return queue.get_nowait()
    getter: asyncio.Future[PrefillProgress] = asyncio.ensure_future(queue.get())
    waiting: set[asyncio.Future[Any]] = {getter, final_task, lease}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()  # a cancelled get leaves its item in the queue
            await asyncio.gather(getter, return_exceptions=True)
    if not getter.cancelled():
        return getter.result()
    if lease.done():
        lease.result()  # raises why the lease ended
    final_task.result()  # raises the engine-side error (e.g. ValueError for a bad prompt)
    if not queue.empty():
        return queue.get_nowait()
    raise RuntimeError("prefill finished without reporting its KV")


class PrefillWorkerService(worker_pb2_grpc.PrefillWorkerServicer):
    def __init__(self, engine: AsyncEngine, progress: ProgressRouter, sender: KVSender) -> None:
        self._engine = engine
        self._progress = progress
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
            return await self._prefill(request, context)
        raise AssertionError("unreachable")

    async def _prefill(
        self, request: wpb.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> wpb.PrefillResponse:
        started = time.monotonic()
        rid = request.request_id
        ids = list(request.prompt_token_ids)
        try:
            params = sampling_params_from_proto(request.sampling_params)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        # Prefill samples only the first token; stop strings are decode's business.
        params = dataclasses.replace(
            params, max_tokens=1, min_tokens=min(params.min_tokens, 1), stop=()
        )
        ticket = ReservationTicket.from_proto(request.reservation)
        try:
            transfer = await self._sender.open(ticket)
        except IncompatiblePeerError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except KVTransferError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"KV transfer: {e}")
        queue = self._progress.register(rid)
        self._queued_tokens += len(ids)
        lease = asyncio.ensure_future(keep_alive(transfer, self._engine))

        def start(e: LLMEngine) -> list[RequestOutput]:
            e.add_request(
                rid,
                prompt_token_ids=ids,
                sampling_params=params,
                priority=request.priority,
                export_kv=True,
            )
            return []

        finished = False
        sent: set[int] = set(ticket.cached_blocks)
        num_sent = 0
        # Consuming the stream is what submits the request; it ends with the first token.
        final_task = asyncio.ensure_future(_last_output(self._engine.attach(rid, start)))
        try:
            while True:
                progress = await _next_progress(queue, final_task, lease)
                total = len(ticket.block_ids)
                ready = (
                    range(total)
                    if progress.is_prompt_done
                    else range(min(progress.num_computed_tokens // self._block_size, total))
                )
                todo = [i for i in ready if i not in sent]
                src = [progress.block_ids[i] for i in todo]
                sent.update(todo)
                num_sent += len(todo)
                if not progress.is_prompt_done:
                    if todo:
                        transfer.push(todo, src)
                    continue
                prompt_done = time.monotonic()
                final = await final_task
                lease.cancel()  # the last message renews it, and completes the reservation
                assert progress.first_token_id is not None
                logprob = 0.0
                top: list[gpb.TopLogprob] = []
                if final.new_logprobs and final.new_logprobs[0].logprob is not None:
                    logprob = final.new_logprobs[0].logprob
                    top = [
                        gpb.TopLogprob(token_id=t, logprob=lp)
                        for t, lp in final.new_logprobs[0].top_logprobs
                    ]
                await transfer.finish(progress.first_token_id, logprob, todo, src)
                finished = True
                self.kv_transfer_seconds.observe(time.monotonic() - prompt_done)
                return wpb.PrefillResponse(
                    first_token_id=progress.first_token_id,
                    first_token_logprob=logprob,
                    num_cached_tokens=final.num_cached_tokens,
                    num_blocks_sent=num_sent,
                    num_blocks_skipped=len(ticket.cached_blocks),
                    prefill_seconds=time.monotonic() - started,
                    first_token_top_logprobs=top,
                )
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (KVTransferError, TimeoutError) as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"KV transfer: {e}")
        finally:
            self._queued_tokens -= len(ids)
            self._progress.unregister(rid)
            lease.cancel()
            await asyncio.gather(lease, return_exceptions=True)  # nothing left unretrieved
            if not final_task.done():
                final_task.cancel()
            try:
                if not finished:
                    await transfer.abort("prefill did not finish")
            finally:
                # Held blocks go back to the pool only now: nothing reads them any more.
                self._engine.abort(rid)
        raise AssertionError("unreachable")

    @property
    def _block_size(self) -> int:
        return self._engine.engine.block_manager.block_size

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
