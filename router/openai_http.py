"""The OpenAI-compatible HTTP server (FastAPI on uvicorn).

``/v1/completions``, ``/v1/chat/completions`` (SSE when ``stream``), ``/v1/models`` and
``/v1/models/{model}``, ``/tokenize`` and ``/detokenize`` (vLLM's), ``/health`` (with KV-block
load, for probes and tests), ``/metrics`` (Prometheus) and ``/openapi.json``. Errors use
OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

import pdserve
from engine.outputs import RequestOutput
from router.admission import Slot
from router.backend import GenerateRequest
from router.errors import RequestError, invalid_argument
from router.fanout import Sequence, best_of, expand, stream_all
from router.http_body import CLIENT_CLOSED_REQUEST, error_body, error_response, parse_body
from router.openai_format import ChatFormatter, CompletionFormatter, Formatter
from router.openai_protocol import ChatCompletionRequest, CompletionRequest
from router.openai_schemas import OPERATIONS
from router.openapi_doc import install_openapi
from router.request_id_http import ID_HEADER
from router.request_ids import check_request_id
from router.service import Router
from router.sse import SSEResponse, wait_for_disconnect
from router.tokenize_api import add_tokenize_routes


def build_app(router: Router, sse_keepalive_s: float = 0.0) -> FastAPI:
    """The OpenAI-compatible app; ``sse_keepalive_s``: router/sse.py."""
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
    backend = router.backend

    async def client_gone(request: Request, exc: Exception) -> Response:
        # The client closed the connection before its body was read (under load the router
        # reads it late): nothing was admitted, nobody is there to answer, nothing to log.
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    app.add_exception_handler(ClientDisconnect, client_gone)

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

    @app.get("/version")
    async def version() -> JSONResponse:
        """vLLM's: the server's version."""
        return JSONResponse({"version": pdserve.__version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    started = int(time.time())  # a model card's `created`: when this server began serving it

    def card(name: str) -> dict[str, Any]:
        info = backend.model_info()
        return {
            "id": name,
            "object": "model",
            "created": started,
            "owned_by": "pdserve",
            "root": info.model,
            "max_model_len": info.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card(n) for n in router.served_names]})

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> JSONResponse:
        """OpenAI's retrieve-model: the card of any name requests may give (404 otherwise)."""
        try:
            router.check_model(model)
        except RequestError as e:
            return error_response(e)
        return JSONResponse(card(model))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            body = await parse_body(request, CompletionRequest, router)
            router.check_model(body.model)
            try:
                params = body.sampling_params()
                prompts = body.prompts()
            except ValueError as e:
                raise invalid_argument(e) from None
            router.check_fanout(len(prompts), body.n, body.best_of)
            base, id_field = _request_id(request, router, "cmpl")
            prepared = [
                await router.prepare(
                    params, prompt=p, priority=body.priority, request_id=base, id_field=id_field
                )
                for p in prompts
            ]
            echo = None
            if body.echo:
                echo = [
                    p if isinstance(p, str) else await router.detokenize(list(p)) for p in prompts
                ]
            slot = router.admit()
        except RequestError as e:
            router.metrics.rejected(e)
            return error_response(e)
        name = body.model or router.model_name
        fmt = CompletionFormatter(base, name, backend.token_strings, body.n, echo)
        return await _respond(request, router, prepared, body, fmt, slot, sse_keepalive_s)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = await parse_body(request, ChatCompletionRequest, router)
            router.check_model(body.model)
            try:
                params = body.sampling_params()
                tool_mode = body.tool_mode()
            except ValueError as e:
                raise invalid_argument(e) from None
            router.check_fanout(1, body.n, body.best_of)
            base, id_field = _request_id(request, router, "chatcmpl")
            messages = [m.as_template_input() for m in body.messages]
            prepared = [
                await router.prepare(
                    params,
                    messages=messages,
                    tools=body.template_tools() if tool_mode != "none" else None,
                    priority=body.priority,
                    request_id=base,
                    id_field=id_field,
                    chat_options=body.template_options(),
                )
            ]
            slot = router.admit()
        except RequestError as e:
            router.metrics.rejected(e)
            return error_response(e)
        name = body.model or router.model_name
        fmt = ChatFormatter(
            base, name, backend.token_strings, body.n, tool_mode != "none", body.forced_tools()
        )
        return await _respond(request, router, prepared, body, fmt, slot, sse_keepalive_s)

    add_tokenize_routes(app, router)
    install_openapi(app, OPERATIONS)
    return app


def _request_id(request: Request, router: Router, prefix: str) -> tuple[str, str]:
    """The request's id and the field it came from: ``<prefix>-<X-Request-Id>`` when the
    client sent that header (request_id_http.py), else a fresh id. Raises
    RequestError(INVALID) naming the header when it is not a valid id."""
    client = request.headers.get("x-request-id")
    if client is None:
        return router.new_request_id(prefix), "request_id"
    check_request_id(client, ID_HEADER)
    return f"{prefix}-{client}", ID_HEADER


async def _respond(
    request: Request,
    router: Router,
    prepared: list[GenerateRequest],
    body: CompletionRequest | ChatCompletionRequest,
    fmt: Formatter,
    slot: Slot,
    sse_keepalive_s: float,
) -> Response:
    deadline = router.deadline(body.timeout)
    n = body.n
    runs = body.best_of or n
    wants_logprobs = prepared[0].sampling_params.logprobs is not None
    if runs > n and not wants_logprobs:  # best_of ranks by cumulative logprob
        prepared = [router.with_logprobs(p) for p in prepared]
    sequences = expand(prepared, runs)
    if body.stream:
        events = _sse_events(router, sequences, deadline, fmt, body.include_usage)

        async def on_close() -> None:
            await events.aclose()
            slot.release()

        return SSEResponse(events, on_close, sse_keepalive_s)
    with slot:
        result = await _whole(request, router, sequences, deadline)
    if isinstance(result, Response):
        return result
    if runs > n:
        result = best_of(result, sequences, n, wants_logprobs)
    return JSONResponse(fmt.response(result))


async def _whole(
    request: Request, router: Router, sequences: list[Sequence], deadline: float | None
) -> dict[int, RequestOutput] | Response:
    async def last() -> dict[int, RequestOutput]:
        finals: dict[int, RequestOutput] = {}
        async for index, out in stream_all(router, sequences, deadline):
            if out.finished:
                finals[index] = out
        return finals

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
        return collect.result()
    except RequestError as e:
        return error_response(e)


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def _sse_events(
    router: Router,
    sequences: list[Sequence],
    deadline: float | None,
    fmt: Formatter,
    include_usage: bool,
) -> AsyncGenerator[str, None]:
    finals: dict[int, RequestOutput] = {}
    try:
        async for index, out in stream_all(router, sequences, deadline):
            chunk = fmt.chunk(index, out)
            if chunk is not None:
                yield _sse(chunk)
            if out.finished:
                finals[index] = out
        if include_usage:
            yield _sse(fmt.usage_chunk(finals))
    except RequestError as e:
        yield _sse(error_body(e))  # the status line is long gone: report it in the stream
    yield _sse("[DONE]")
