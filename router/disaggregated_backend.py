"""The disaggregated backend: decode workers hold the running batches, prefill workers compute
prompts and push their KV straight into the blocks decode reserved.

Per request:
    1. pick a routable decode worker (most free blocks, then fewest running) and open its
       Generate stream; its first message is either a reservation ticket or "local prefill"
       (it may come after heartbeats while decode waits for free blocks);
    2. with a ticket, pick a routable prefill worker (longest remembered prefix, then fewest
       queued prefill tokens) and call Prefill; it pushes KV chunk by chunk to the decode
       worker, renewing decode's lease while it works, and returns the first token;
    3. stream decode's token deltas back.

Every wait has a deadline or a heartbeat behind it: a decode stream that sends neither a
token nor a heartbeat for ``stall_timeout_s`` fails the request (UNAVAILABLE, "stalled");
the Prefill call has no deadline of its own because the decode stream watches it (a prefill
worker that stops renewing loses the reservation within decode's lease, and decode's stream
then fails). Any failure is a ``RequestError``; leaving the generator cancels both calls, and
the workers free their blocks (see decode_service.service).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import grpc

from engine.block_hash import hash_block_tokens
from engine.model_card import load_model_card
from engine.outputs import RequestOutput
from pdserve.tls import ClientTls
from pdserve.wire import OutputAccumulator, sampling_params_to_proto
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc
from router.backend import GenerateRequest, Load, ModelInfo, served_names
from router.errors import ErrorKind, RequestError
from router.prefix_index import PrefixIndex
from router.tokenizer_ops import TokenizerOps
from router.worker_pool import Worker, WorkerPool

DEFAULT_STALL_TIMEOUT_S = 10.0


class DisaggregatedBackend:
    """Implements ``router.backend.Backend`` over gRPC prefill and decode worker pools."""

    def __init__(
        self,
        model: str,
        decode_targets: Sequence[str],
        prefill_targets: Sequence[str],
        served_model_name: str | Sequence[str] | None = None,
        block_size: int = 16,
        max_model_len: int | None = None,
        local_prefill_max_tokens: int = 0,
        load_poll_s: float = 0.1,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        worker_tls: ClientTls | None = None,
    ) -> None:
        """``stall_timeout_s``: a decode stream silent (no token, no heartbeat) this long
        fails its request; decode workers send a heartbeat every ``--heartbeat-s`` (1 s by
        default) while they have nothing else to send, so keep it well above that.
        ``worker_tls``: dial the workers over mutual TLS (pdserve.tls)."""
        if not decode_targets or not prefill_targets:
            raise ValueError("need at least one decode and one prefill worker")
        if stall_timeout_s <= 0:
            raise ValueError(f"--stall-timeout-s must be positive, got {stall_timeout_s}")
        mc = load_model_card(model)
        self._text = TokenizerOps(model)
        names = served_names(served_model_name, mc.path)
        self._info = ModelInfo(
            model=names[0],
            architecture=mc.architecture,
            dtype=mc.dtype(),
            max_model_len=min(
                max_model_len or mc.max_position_embeddings, mc.max_position_embeddings
            ),
            vocab_size=mc.vocab_size,
            block_size=block_size,
            eos_token_ids=tuple(mc.eos_token_ids),
            served_names=names,
            model_path=model,
        )
        self._decode = WorkerPool(
            "decode", decode_targets, worker_pb2_grpc.DecodeWorkerStub, load_poll_s, worker_tls
        )
        self._prefill = WorkerPool(
            "prefill", prefill_targets, worker_pb2_grpc.PrefillWorkerStub, load_poll_s, worker_tls
        )
        self._local_prefill_max_tokens = local_prefill_max_tokens
        self._stall_timeout_s = stall_timeout_s
        self._aborted: set[str] = set()
        self._calls: dict[str, list[Any]] = {}
        self._block_size = block_size
        self.prefix_index = PrefixIndex()

    async def start(self) -> None:
        """Open channels and start polling worker load (call on the router's event loop)."""
        await asyncio.gather(self._decode.start(), self._prefill.start())

    # ------------------------------------------------------------------ Backend
    def model_info(self) -> ModelInfo:
        return self._info

    def load(self) -> Load:
        """Healthy decode and prefill workers together (a snapshot at most ``load_poll_s``
        old); a worker that stopped answering does not count."""
        loads = self._decode.loads() + self._prefill.loads()
        return Load(
            num_blocks=sum(x.num_blocks for x in loads),
            num_free_blocks=sum(x.num_free_blocks for x in loads),
            num_running_requests=sum(x.num_running_requests for x in loads),
            num_waiting_requests=sum(x.num_waiting_requests for x in loads),
        )

    def is_healthy(self) -> bool:
        return self._decode.num_healthy > 0 and self._prefill.num_healthy > 0

    def healthy_workers(self) -> dict[str, int]:
        """Workers that answered the last load poll, by pool (for metrics)."""
        return {"prefill": self._prefill.num_healthy, "decode": self._decode.num_healthy}

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        ids = (
            list(request.prompt_token_ids)
            if request.prompt_token_ids is not None
            else self._tokenize_prompt(request.prompt)
        )
        rid = request.request_id
        threshold = self._local_prefill_max_tokens
        if not (threshold < 0 or 0 < len(ids) <= threshold):
            self._prefill.routable()  # fail fast, before decode reserves anything
        decode = self._pick_decode()
        call = decode.stub.Generate(
            wpb.WorkerGenerateRequest(
                request_id=rid,
                prompt_token_ids=ids,
                sampling_params=sampling_params_to_proto(request.sampling_params),
                priority=request.priority,
                local_prefill_max_tokens=self._local_prefill_max_tokens,
            )
        )
        self._calls[rid] = [call]
        prefill: asyncio.Task[wpb.PrefillResponse] | None = None
        acc = OutputAccumulator(rid, ids, request.prompt)
        try:
            first = await self._read(call, decode, rid)
            if first is None:
                raise RequestError(
                    ErrorKind.UNAVAILABLE, f"decode worker {decode.target} closed the stream"
                )
            if first.HasField("reservation"):
                prefill = asyncio.ensure_future(self._prefill_call(request, ids, first))
                self._calls[rid].append(prefill)
                msg = await self._read_while_prefilling(call, decode, rid, prefill)
            else:
                msg = await self._read(call, decode, rid)
            first_output = True
            while msg is not None:
                if first_output and prefill is not None and msg.output.logprobs:
                    # Only prefill saw the first token's whole distribution: decode got the
                    # token and its logprob over the KV channel; take the top-n from prefill.
                    response = await self._prefill_response(prefill)
                    msg.output.logprobs[0].top_logprobs.extend(response.first_token_top_logprobs)
                first_output = False
                out = acc.add(msg.output)
                yield out
                if out.finished:
                    return
                msg = await self._read(call, decode, rid)
            raise RequestError(
                ErrorKind.UNAVAILABLE,
                f"decode worker {decode.target} ended the stream before the request finished",
            )
        finally:
            self._calls.pop(rid, None)
            self._aborted.discard(rid)
            call.cancel()
            if prefill is not None:
                if not prefill.done():
                    prefill.cancel()
                with contextlib.suppress(BaseException):
                    await prefill  # also retrieves a failure nobody else looked at

    def abort(self, request_id: str) -> None:
        calls = self._calls.get(request_id)
        if calls is not None:
            self._aborted.add(request_id)
            for c in calls:
                c.cancel()

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._text.tokenize(text, add_special_tokens)

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return self._text.token_strings(token_ids)

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        return self._text.render_chat(messages, tools)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._text.detokenize(token_ids)

    async def close(self) -> None:
        await asyncio.gather(self._decode.close(), self._prefill.close())

    # ----------------------------------------------------------------- private
    def _tokenize_prompt(self, prompt: str | None) -> list[int]:
        if not prompt:
            raise ValueError("prompt must not be empty")
        return self.tokenize(prompt)

    def _pick_decode(self) -> Worker:
        return self._decode.pick(
            self._decode.routable(),
            key=lambda load: (-load.num_free_blocks, load.num_running_requests),
        )

    def _pick_prefill(self, hashes: list[Any]) -> Worker:
        """Longest remembered prefix first (its blocks are likely cached there), then the
        fewest queued prefill tokens."""
        workers = self._prefill.routable()
        best = max(self.prefix_index.match(w.target, hashes) for w in workers)
        if best > 0:
            workers = [w for w in workers if self.prefix_index.match(w.target, hashes) == best]
        return self._prefill.pick(
            workers, key=lambda load: (load.num_queued_prefill_tokens, load.num_running_requests)
        )

    async def _prefill_call(
        self, request: GenerateRequest, ids: list[int], first: wpb.DecodeMessage
    ) -> wpb.PrefillResponse:
        hashes = hash_block_tokens(ids, self._block_size)
        prefill = self._pick_prefill(hashes)
        self.prefix_index.insert(prefill.target, hashes)
        try:
            response: wpb.PrefillResponse = await prefill.stub.Prefill(
                wpb.PrefillRequest(
                    request_id=request.request_id,
                    prompt_token_ids=ids,
                    sampling_params=sampling_params_to_proto(request.sampling_params),
                    priority=request.priority,
                    reservation=first.reservation,
                )
            )
        except grpc.aio.AioRpcError as e:
            raise _request_error(e, prefill) from None
        return response

    async def _read_while_prefilling(
        self,
        call: Any,
        decode: Worker,
        rid: str,
        prefill: asyncio.Task[wpb.PrefillResponse],
    ) -> wpb.DecodeMessage | None:
        """Decode's next message, failing at once if the prefill fails first (decode's stream
        would end too, once its reservation is released, but the client hears sooner)."""
        read = asyncio.ensure_future(self._read(call, decode, rid))
        try:
            done, _ = await asyncio.wait({read, prefill}, return_when=asyncio.FIRST_COMPLETED)
            if prefill in done and not read.done():
                if prefill.cancelled():  # by abort()
                    raise RequestError(ErrorKind.UNAVAILABLE, "the request was aborted")
                prefill.result()  # raises the prefill's RequestError, if it failed
            return await read
        finally:
            if not read.done():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read

    async def _prefill_response(
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

    async def _read(self, call: Any, worker: Worker, rid: str) -> wpb.DecodeMessage | None:
        """The next message that is not a heartbeat; None at the end of the stream."""
        while True:
            try:
                async with asyncio.timeout(self._stall_timeout_s):
                    msg = await call.read()
            except TimeoutError:
                self._decode.mark_stalled(worker)
                raise RequestError(
                    ErrorKind.UNAVAILABLE,
                    f"decode worker {worker.target} stalled: no token or heartbeat for "
                    f"{self._stall_timeout_s:g}s; the request was aborted",
                ) from None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if rid in self._aborted and task is not None and not task.cancelling():
                    raise RequestError(ErrorKind.UNAVAILABLE, "the request was aborted") from None
                raise
            except grpc.aio.AioRpcError as e:
                raise _request_error(e, worker) from None
            if msg is grpc.aio.EOF:
                return None
            if msg.WhichOneof("kind") != "heartbeat":
                return msg  # type: ignore[no-any-return]


def _request_error(e: grpc.aio.AioRpcError, worker: Worker) -> Exception:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RequestError(ErrorKind.BUSY, details, retry_after_s=1.0)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestError(ErrorKind.TIMEOUT, details)
    if code == grpc.StatusCode.CANCELLED:
        return RequestError(
            ErrorKind.UNAVAILABLE, f"the {worker.role} worker {worker.target} cancelled it"
        )
    return RequestError(
        ErrorKind.UNAVAILABLE, f"{worker.role} worker {worker.target}: {code.name}: {details}"
    )
