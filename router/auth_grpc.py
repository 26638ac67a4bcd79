"""API keys on the gRPC server: an interceptor reading the ``authorization`` metadata
(``Bearer <key>``, as grpcurl ``-H 'authorization: Bearer KEY'`` or a client's call
credentials send it). A call without an accepted key ends with UNAUTHENTICATED before its
handler runs; its handler's own shape (unary or streaming) is kept, so clients see a normal
status."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from router.auth import Authenticator, AuthFailure
from router.auth_metrics import AuthMetrics


def _refusing(handler: grpc.RpcMethodHandler, failure: AuthFailure) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, failure.message)

    async def abort_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, failure.message)
        yield  # pragma: no cover - makes this an async generator (streaming responses)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_stream, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kwargs)
    return grpc.unary_unary_rpc_method_handler(abort, **kwargs)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, auth: Authenticator, metrics: AuthMetrics) -> None:
        self._auth = auth
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        header = None
        for key, value in handler_call_details.invocation_metadata or ():  # type: ignore[attr-defined]
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
                break
        failure = self._auth.check(handler_call_details.method, header)  # type: ignore[attr-defined]
        handler = await continuation(handler_call_details)
        if failure is None or handler is None:
            return handler
        self._metrics.failed("grpc", failure)
        return _refusing(handler, failure)
