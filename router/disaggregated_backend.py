"""The disaggregated backend: decode workers hold the running batches, prefill workers compute
prompts and push their KV straight into the blocks decode reserved.

Per request:
    1. pick a decode worker (most free blocks, then fewest running) and open its Generate
       stream; its first message is either a reservation ticket or "local prefill";
    2. with a ticket, pick a prefill worker (fewest queued prefill tokens) and call Prefill;
       it pushes KV chunk by chunk to the decode worker and returns the first token;
    3. stream decode's token deltas back. Cancelling anywhere cancels both calls; the
       workers then free their blocks (see decode_service.service).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from engine.block_hash import hash_block_tokens
from engine.model_card import load_model_card
from engine.outputs import RequestOutput
from pdserve.tls import ClientTls, open_channel
from pdserve.wire import OutputAccumulator, sampling_params_to_proto
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc
from router.backend import GenerateRequest, Load, ModelInfo, served_names
from router.errors import ErrorKind, RequestError
from router.prefix_index import PrefixIndex
from router.tokenizer_ops import TokenizerOps

logger = logging.getLogger(__name__)


@dataclass
class _Worker:
    target: str
    channel: grpc.aio.Channel
    stub: Any
    load: wpb.WorkerLoad | None = None
    healthy: bool = False


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
        worker_tls: ClientTls | None = None,
    ) -> None:
        """``worker_tls``: dial the workers over mutual TLS (pdserve.tls)."""

        if not decode_targets or not prefill_targets:
            raise ValueError("need at least one decode and one prefill worker")
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
        self._decode_targets = list(decode_targets)
        self._prefill_targets = list(prefill_targets)
        self._local_prefill_max_tokens = local_prefill_max_tokens
        self._load_poll_s = load_poll_s
        self._decode: list[_Worker] = []
        self._prefill: list[_Worker] = []
        self._poller: asyncio.Task[None] | None = None
        self._rr = itertools.count()
        self._calls: dict[str, list[Any]] = {}
        self._block_size = block_size
        self._worker_tls = worker_tls
        self.prefix_index = PrefixIndex()

    async def start(self) -> None:
        """Open channels and start polling worker load (call on the router's event loop)."""
        self._decode = [
            self._open(t, worker_pb2_grpc.DecodeWorkerStub) for t in self._decode_targets
        ]
        self._prefill = [
            self._open(t, worker_pb2_grpc.PrefillWorkerStub) for t in self._prefill_targets
        ]
        await self._poll_once()
        self._poller = asyncio.create_task(self._poll_forever())

    def _open(self, target: str, stub_cls: Any) -> _Worker:
        channel = open_channel(target, self._worker_tls)
        return _Worker(target, channel, stub_cls(channel))

    # ------------------------------------------------------------------ Backend
    def model_info(self) -> ModelInfo:
        return self._info

    def load(self) -> Load:
        """Decode and prefill pools together (a snapshot at most ``load_poll_s`` old)."""
        loads = [w.load for w in self._decode + self._prefill if w.load is not None]
        return Load(
            num_blocks=sum(x.num_blocks for x in loads),
            num_free_blocks=sum(x.num_free_blocks for x in loads),
            num_running_requests=sum(x.num_running_requests for x in loads),
            num_waiting_requests=sum(x.num_waiting_requests for x in loads),
        )

    def is_healthy(self) -> bool:
        return any(w.healthy for w in self._decode) and any(w.healthy for w in self._prefill)

    def healthy_workers(self) -> dict[str, int]:
        """Workers that answered the last load poll, by pool (for metrics)."""
        return {
            "prefill": sum(w.healthy for w in self._prefill),
            "decode": sum(w.healthy for w in self._decode),
        }

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        ids = (
            list(request.prompt_token_ids)
            if request.prompt_token_ids is not None
            else self._tokenize_prompt(request.prompt)
        )
        rid = request.request_id
        decode = self._pick(self._decode, decode=True)
        call = decode.stub.Generate(
            wpb.WorkerGenerateRequest(
                request_id=rid,
                prompt_token_ids=ids,
                sampling_params=sampling_params_to_proto(request.sampling_params),
                priority=request.priority,
                local_prefill_max_tokens=self._local_prefill_max_tokens,
            )
        )
        prefill_task: asyncio.Task[Any] | None = None
        self._calls[rid] = [call]
        acc = OutputAccumulator(rid, ids, request.prompt)
        try:
            first = await self._read(call)
            if first is None:
                raise RequestError(ErrorKind.UNAVAILABLE, "decode worker closed the stream")
            if first.HasField("reservation"):
                hashes = hash_block_tokens(ids, self._block_size)
                prefill = self._pick_prefill(hashes)
                self.prefix_index.insert(prefill.target, hashes)
                prefill_task = asyncio.ensure_future(
                    prefill.stub.Prefill(
                        wpb.PrefillRequest(
                            request_id=rid,
                            prompt_token_ids=ids,
                            sampling_params=sampling_params_to_proto(request.sampling_params),
                            priority=request.priority,
                            reservation=first.reservation,
                        )
                    )
                )
                self._calls[rid].append(prefill_task)
                # A failed prefill means decode's reservation is released: its stream then
                # ends with UNAVAILABLE. Cancel at once so the client hears sooner.
                prefill_task.add_done_callback(lambda t: _cancel_on_error(t, call))
            first_output = True
            while True:
                msg = await self._read(call)
                if msg is None:
                    break
                if first_output and prefill_task is not None and msg.output.logprobs:
                    # Only prefill saw the first token's whole distribution: decode got the
                    # token and its logprob over the KV channel; take the top-n from prefill.
                    response = await prefill_task
                    msg.output.logprobs[0].top_logprobs.extend(response.first_token_top_logprobs)
                first_output = False
                out = acc.add(msg.output)
                yield out
                if out.finished:
                    break
        finally:
            self._calls.pop(rid, None)
            call.cancel()
            if prefill_task is not None and not prefill_task.done():
                prefill_task.cancel()
                with contextlib.suppress(BaseException):
                    await prefill_task

    def abort(self, request_id: str) -> None:
        for c in self._calls.pop(request_id, []):
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
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        for w in self._decode + self._prefill:
            await w.channel.close()

    # ----------------------------------------------------------------- private
    def _tokenize_prompt(self, prompt: str | None) -> list[int]:
        if not prompt:
            raise ValueError("prompt must not be empty")
        return self.tokenize(prompt)

    @staticmethod
    async def _read(call: Any) -> wpb.DecodeMessage | None:
        try:
            msg = await call.read()
        except grpc.aio.AioRpcError as e:
            raise _request_error(e) from e
        if msg is grpc.aio.EOF:
            return None
        return msg  # type: ignore[no-any-return]

    def _pick_prefill(self, hashes: list[Any]) -> _Worker:
        """Longest remembered prefix first (its blocks are likely cached there), then the
        fewest queued prefill tokens."""
        healthy = [w for w in self._prefill if w.healthy] or self._prefill
        best = max(self.prefix_index.match(w.target, hashes) for w in healthy)
        if best == 0:
            return self._pick(healthy, decode=False)
        return self._pick(
            [w for w in healthy if self.prefix_index.match(w.target, hashes) == best],
            decode=False,
        )

    def _pick(self, workers: list[_Worker], decode: bool) -> _Worker:
        healthy = [w for w in workers if w.healthy] or workers
        with_load = [w for w in healthy if w.load is not None]
        if not with_load:
            return healthy[next(self._rr) % len(healthy)]
        if decode:
            return max(
                with_load,
                key=lambda w: (w.load.num_free_blocks, -w.load.num_running_requests),  # type: ignore[union-attr]
            )
        return min(
            with_load,
            key=lambda w: (w.load.num_queued_prefill_tokens, w.load.num_running_requests),  # type: ignore[union-attr]
        )

    async def _poll_once(self) -> None:
        async def poll(w: _Worker) -> None:
            try:
                w.load = await w.stub.GetLoad(wpb.GetLoadRequest(), timeout=2.0)
                w.healthy = True
            except grpc.aio.AioRpcError:
                w.healthy = False

        await asyncio.gather(*(poll(w) for w in self._decode + self._prefill))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._load_poll_s)
            await self._poll_once()


def _cancel_on_error(task: asyncio.Task[Any], call: Any) -> None:
    if task.cancelled() or task.exception() is not None:
        if task.exception() is not None:
            logger.warning("prefill failed: %s", task.exception())
        call.cancel()


def _request_error(e: grpc.aio.AioRpcError) -> Exception:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RequestError(ErrorKind.BUSY, details, retry_after_s=1.0)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestError(ErrorKind.TIMEOUT, details)
    if code == grpc.StatusCode.CANCELLED:
        return RequestError(ErrorKind.UNAVAILABLE, "the request was cancelled by a worker")
    return RequestError(ErrorKind.UNAVAILABLE, f"worker error: {code.name}: {details}")
