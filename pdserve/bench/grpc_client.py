"""pdserve's gRPC client: ``pdserve.v1.GenerationService/Generate`` (server streaming)."""

from __future__ import annotations

from typing import Any

import grpc

from pdserve.bench.client import StreamTimer
from pdserve.bench.records import CANCELLED, FAILED, OK, RequestRecord
from pdserve.bench.workload import BenchRequest, PromptRenderer


class GrpcClient:
    """``target`` is ``host:port``. Token-id prompts go as ``token_ids`` unless
    ``prompt_format`` is "text"."""

    def __init__(
        self,
        target: str,
        *,
        model: str | None = None,
        prompt_format: str = "auto",
        renderer: PromptRenderer | None = None,
        ignore_eos: bool = True,
        temperature: float = 0.0,
        timeout_s: float = 600.0,
    ) -> None:
        from protos.pdserve.v1 import generate_pb2, generate_pb2_grpc

        self._pb = generate_pb2
        self._channel = grpc.aio.insecure_channel(target)
        self._stub: Any = generate_pb2_grpc.GenerationServiceStub(self._channel)
        self._model = model
        self.prompt_format = prompt_format
        self.renderer = renderer or PromptRenderer()
        self.ignore_eos = ignore_eos
        self.temperature = temperature
        self.timeout_s = timeout_s

    async def model_name(self) -> str:
        if self._model is None:
            info = await self._stub.GetModelInfo(self._pb.GetModelInfoRequest(), timeout=30)
            self._model = str(info.model)
        return self._model

    def message(self, request: BenchRequest, model: str) -> Any:
        pb = self._pb
        params = pb.SamplingParams(
            max_tokens=request.max_tokens,
            temperature=self.temperature,
            ignore_eos=self.ignore_eos,
        )
        msg = pb.GenerateRequest(sampling_params=params, model=model)
        if self.prompt_format == "auto" and request.prompt_token_ids is not None:
            msg.token_ids.ids.extend(request.prompt_token_ids)
        else:
            msg.text = self.renderer.text(request)
        return msg

    async def send(self, request: BenchRequest, t0: float) -> RequestRecord:
        record = RequestRecord(
            index=request.index,
            start_s=0.0,
            num_prompt_tokens=request.num_prompt_tokens,
            has_shared_prefix=request.has_shared_prefix,
        )
        call = None
        try:
            msg = self.message(request, await self.model_name())
            timer = StreamTimer(record, t0)
            call = self._stub.Generate(msg, timeout=self.timeout_s)
            async for resp in call:
                if resp.token_ids:
                    timer.chunk()
                    record.num_output_tokens += len(resp.token_ids)
                if resp.finished:
                    record.finish_reason = resp.finish_reason
                    if resp.HasField("usage"):
                        record.usage_reported = True
                        record.num_prompt_tokens = resp.usage.prompt_tokens
                        record.num_output_tokens = resp.usage.completion_tokens
                        record.num_cached_tokens = resp.usage.cached_tokens
                cancel_at = request.cancel_after_tokens
                if cancel_at is not None and record.num_chunks >= cancel_at and not resp.finished:
                    call.cancel()
                    record.status = CANCELLED
                    timer.finish()
                    return record
            timer.finish()
            if record.finish_reason is None:
                record.error = "the stream ended without a finished message"
            elif record.finish_reason in ("abort", "error"):
                record.error = f"finish_reason {record.finish_reason}"
            else:
                record.status = OK
        except grpc.aio.AioRpcError as e:
            record.status, record.error = FAILED, f"gRPC {e.code().name}: {e.details()}"
        except Exception as e:  # any failure is data, not a crash of the benchmark
            record.status, record.error = FAILED, f"{type(e).__name__}: {e}"
        return record

    async def aclose(self) -> None:
        await self._channel.close()
