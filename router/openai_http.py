"""The OpenAI-compatible HTTP server (FastAPI on uvicorn).

``/v1/completions``, ``/v1/chat/completions`` (SSE when ``stream``), ``/v1/models`` and
``/health`` (with KV-block load, for probes and tests) and ``/metrics`` (Prometheus). Errors
use OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncGenerator
from dataclasses import asdict
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from engine.outputs import RequestOutput
from router.admission import Slot
from router.backend import GenerateRequest
from router.errors import ErrorKind, RequestError, invalid_argument
from router.openai_format import ChatFormatter, CompletionFormatter, Formatter
from router.openai_protocol import ChatCompletionRequest, CompletionRequest
from router.service import Router
from router.sse import SSEResponse, wait_for_disconnect

M = TypeVar("M", bound=BaseModel)

_HTTP_STATUS = {
    ErrorKind.INVALID: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.BUSY: 429,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}
CLIENT_CLOSED_REQUEST = 499  # nginx's code; nobody reads it, but logs do


def error_body(e: RequestError) -> dict[str, Any]:
    status = _HTTP_STATUS[e.kind]
    return {"error": {"message": e.message, "type": e.kind.value, "param": e.param, "code": status}}


def error_response(e: RequestError) -> JSONResponse:
    headers = {}
    if e.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(e.retry_after_s)))
    return JSONResponse(error_body(e), status_code=_HTTP_STATUS[e.kind], headers=headers)


async def parse_body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            ErrorKind.INVALID, f"the body is not valid UTF-8 (byte {e.start})"
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(ErrorKind.INVALID, f"malformed JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RequestError(ErrorKind.INVALID, "the body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None
        where = ".".join(
            str(p)
            for p in first["loc"][:1] + tuple(p for p in first["loc"][1:] if isinstance(p, int))
        )
        raise RequestError(ErrorKind.INVALID, f"{where}: {first['msg']}", param) from None


def build_app(router: Router) -> FastAPI:
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
    backend = router.backend

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = backend.is_healthy() and not router.is_draining
        admission = router.admission
        return JSONResponse(
            {
                "status": "ok" if ok else "draining" if router.is_draining else "unavailable",
                "model": router.model_name,
                "load": asdict(backend.load()),
                "num_inflight_requests": admission.num_inflight,
                "max_inflight_requests": admission.max_inflight,
                "num_rejected_requests": admission.num_rejected,
            },
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        info = backend.model_info()
        card = {
            "id": info.model,
            "object": "model",
            "created": 0,
            "owned_by": "pdserve",
            "max_model_len": info.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            body = await parse_body(request, CompletionRequest)
            router.check_model(body.model)
            try:
                params = body.sampling_params()
                prompt = body.single_prompt()
            except ValueError as e:
                raise invalid_argument(e) from None
            greq = router.prepare(params, prompt=prompt, priority=body.priority, id_prefix="cmpl")
            slot = router.admit()
        except RequestError as e:
            router.metrics.rejected(e)
            return error_response(e)
        fmt = CompletionFormatter(greq.request_id, router.model_name, backend.token_strings)
        return await _respond(request, router, greq, body.timeout, fmt, slot, body)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = await parse_body(request, ChatCompletionRequest)
            router.check_model(body.model)
            try:
                params = body.sampling_params()
            except ValueError as e:
                raise invalid_argument(e) from None
            messages = [m.as_template_input() for m in body.messages]
            greq = router.prepare(
                params, messages=messages, priority=body.priority, id_prefix="chatcmpl"
            )
            slot = router.admit()
        except RequestError as e:
            router.metrics.rejected(e)
            return error_response(e)
        fmt = ChatFormatter(greq.request_id, router.model_name, backend.token_strings)
        return await _respond(request, router, greq, body.timeout, fmt, slot, body)

    return app


async def _respond(
    request: Request,
    router: Router,
    greq: GenerateRequest,
    timeout_s: float | None,
    fmt: Formatter,
    slot: Slot,
    body: CompletionRequest | ChatCompletionRequest,
) -> Response:
    deadline = router.deadline(timeout_s)
    if body.stream:
        events = _sse_events(router, greq, deadline, fmt, body.include_usage)

        async def on_close() -> None:
            await events.aclose()
            slot.release()

        return SSEResponse(events, on_close)
    with slot:
        return await _whole(request, router, greq, deadline, fmt)


async def _whole(
    request: Request,
    router: Router,
    greq: GenerateRequest,
    deadline: float | None,
    fmt: Formatter,
) -> Response:
    async def last() -> RequestOutput:
        final = None
        async for out in router.stream(greq, deadline):
            final = out
        assert final is not None
        return final

    collect = asyncio.ensure_future(last())
    watcher = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({collect, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (collect, watcher):
            task.cancel()
        await asyncio.gather(collect, watcher, return_exceptions=True)
    if collect.cancelled():  # the client went away; the request was aborted
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    try:
        final = collect.result()
    except RequestError as e:
        return error_response(e)
    return JSONResponse(fmt.response(final))


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _sse_events(
    router: Router,
    greq: GenerateRequest,
    deadline: float | None,
    fmt: Formatter,
    include_usage: bool,
) -> AsyncGenerator[str, None]:
    try:
        async for out in router.stream(greq, deadline):
            chunk = fmt.chunk(out)
            if chunk is not None:
                yield _sse(chunk)
            if out.finished and include_usage:
                yield _sse(fmt.usage_chunk(out))
    except RequestError as e:
        yield _sse(error_body(e))  # the status line is long gone: report it in the stream
    yield _sse("[DONE]")
