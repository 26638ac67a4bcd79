"""The router's calls to the workers of one request attempt, each bounded: the Prefill call
(watched by the decode stream) and the decode stream's reads (stalled after
``stall_timeout_s`` without a token or heartbeat). Failures come out as ``RequestError``, or
as ``WorkerFailure`` when another worker may take the request over (router.worker_errors)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc

from pdserve.wire import sampling_params_to_proto
from protos.pdserve.v1 import worker_pb2 as wpb
from router.backend import GenerateRequest
from router.cluster_router import ClusterRouter, Target
from router.errors import ErrorKind, RequestError
from router.migration import WorkerFailure
from router.worker_errors import REFUSALS, Refused, request_error


class WorkerCalls:
    def __init__(self, cluster: ClusterRouter, stall_timeout_s: float, aborted: set[str]) -> None:
        """``aborted``: the ids of requests the backend aborted (a cancelled read of one of
        them is the abort, not a cancellation of the caller)."""
        self.cluster = cluster
        self._stall_timeout_s = stall_timeout_s
        self._aborted = aborted

    async def prefill(
        self,
        request: GenerateRequest,
        worker_rid: str,
        ids: list[int],
        resume: wpb.Resume | None,
        first: wpb.DecodeMessage,
        prefill: Target,
    ) -> wpb.PrefillResponse:
        try:
            response: wpb.PrefillResponse = await prefill.stub.Prefill(
                wpb.PrefillRequest(
                    request_id=worker_rid,
                    prompt_token_ids=ids,
                    sampling_params=sampling_params_to_proto(request.sampling_params),
                    priority=request.priority,
                    reservation=first.reservation,
                    resume=resume,
                )
            )
        except grpc.aio.AioRpcError as e:
            raise request_error(e, prefill) from None
        return response

    async def read_while_prefilling(
        self,
        call: Any,
        decode: Target,
        rid: str,
        prefill: asyncio.Task[wpb.PrefillResponse],
        prefill_worker: Target,
    ) -> wpb.DecodeMessage | None:
        """Decode's next message, failing at once if the prefill fails first (decode's stream
        would end too, once its reservation is released, but the client hears sooner). When
        decode's reservation ends because the prefill worker went silent (the lease expired
        unrenewed) or its KV connection broke while the Prefill call is still pending, the
        failure is the prefill worker's: migration then avoids it, not the decode worker."""
        read = asyncio.ensure_future(self.read(call, decode, rid))
        try:
            done, _ = await asyncio.wait({read, prefill}, return_when=asyncio.FIRST_COMPLETED)
            if prefill in done and not read.done():
                if prefill.cancelled():  # by abort()
                    raise RequestError(ErrorKind.UNAVAILABLE, "the request was aborted")
                prefill.result()  # raises the prefill's RequestError, if it failed
            try:
                return await read
            except WorkerFailure as e:
                blamed = _prefill_blamed(e.message)
                if blamed is None or prefill.done():
                    raise
                raise WorkerFailure(
                    f"prefill worker {prefill_worker.address}: {e.message}",
                    blamed,
                    prefill_worker.worker_id,
                ) from None
        finally:
            if not read.done():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read

    async def prefill_response(
        self, prefill: asyncio.Task[wpb.PrefillResponse]
    ) -> wpb.PrefillResponse:
        try:
            async with asyncio.timeout(self._stall_timeout_s):
                return await asyncio.shield(prefill)
        except TimeoutError:
            raise RequestError(
                ErrorKind.UNAVAILABLE,
                f"the prefill worker did not answer within {self._stall_timeout_s:g}s of "
                "decode admitting the request",
            ) from None

    async def read(
        self, call: Any, worker: Target, rid: str, first: bool = False
    ) -> wpb.DecodeMessage | None:
        """The next message that is not a heartbeat; None at the end of the stream. ``first``:
        a refusal (busy, draining, unreachable) raises ``Refused`` (the caller retries)."""
        while True:
            try:
                async with asyncio.timeout(self._stall_timeout_s):
                    msg = await call.read()
            except TimeoutError:
                self.cluster.mark_stalled(worker)
                raise WorkerFailure(
                    f"decode worker {worker.address} stalled: no token or heartbeat for "
                    f"{self._stall_timeout_s:g}s",
                    "stall",
                    worker.worker_id,
                ) from None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if rid in self._aborted and task is not None and not task.cancelling():
                    raise RequestError(ErrorKind.UNAVAILABLE, "the request was aborted") from None
                raise
            except grpc.aio.AioRpcError as e:
                if first and e.code() in REFUSALS:
                    raise Refused(request_error(e, worker)) from None
                raise request_error(e, worker) from None
            if msg is grpc.aio.EOF:
                return None
            if msg.WhichOneof("kind") != "heartbeat":
                return msg  # type: ignore[no-any-return]


def _prefill_blamed(decode_error: str) -> str | None:
    """The migration reason when decode's error says its KV never came from the prefill
    worker (kv_transfer.decode_connector's release reasons), else None."""
    if "ended before completion: expired" in decode_error:
        return "stall"
    if "ended before completion: peer_lost" in decode_error:
        return "worker_lost"
    if "ended before completion: aborted" in decode_error:
        return "worker_error"  # it gave up (e.g. shutting down); its own answer tells why
    return None
