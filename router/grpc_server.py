"""The public gRPC server: ``pdserve.v1.GenerationService`` plus grpc.health.v1 and reflection."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import pdserve
from pdserve.tls import EXCLUSIVE_PORT, ServerTls, add_port
from pdserve.wire import delta_to_proto, sampling_params_from_proto
from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from router.errors import ErrorKind, RequestError, invalid_argument
from router.fanout import best_of, expand, stream_all
from router.grpc_chat import ToolCallsOut, chat_from_proto
from router.grpc_connections import GrpcConnectionPolicy
from router.request_ids import check_request_id
from router.service import Router
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS

R = TypeVar("R")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GenerationService"].full_name

_STATUS = {
    ErrorKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}


class Undecodable:
    """A request protobuf could not parse (e.g. a string field holding invalid UTF-8)."""

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A request deserializer that hands a parse failure to the method, which answers
    INVALID_ARGUMENT (grpc's own handling of a failed parse would say INTERNAL)."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as e:
            return Undecodable(str(e))

    return deserialize


def _undecodable(request: object) -> RequestError | None:
    if isinstance(request, Undecodable):
        return RequestError(ErrorKind.INVALID, f"request: cannot parse it: {request.error}")
    return None


async def _abort(context: grpc.aio.ServicerContext, e: RequestError) -> None:
    """End the call with ``e``'s status. A call gRPC has ended already (its deadline passed, or
    the client cancelled, a moment before the router's own deadline fired) has nobody to
    answer: return quietly instead of failing the handler."""
    if context.done():
        return
    trailers: tuple[tuple[str, str], ...] = ()
    if e.retry_after_s is not None:
        trailers = (("retry-after-s", f"{e.retry_after_s:g}"),)
    try:
        await context.abort(_STATUS[e.kind], e.message, trailing_metadata=trailers)
    except grpc.aio.AbortError:
        raise  # how abort() unwinds the handler once the status is sent
    except Exception:
        if not context.done():
            raise
        # Ended between the check and the abort: same as above.


async def _tokenize(router: Router, request: pb.TokenizeRequest) -> list[int]:
    """The text's ids, or the chat's as Generate would render it."""
    if request.HasField("chat"):
        if request.text or request.HasField("add_special_tokens"):
            field = "text" if request.text else "add_special_tokens"
            raise RequestError(
                ErrorKind.INVALID,
                f"{field}: give text or chat, not both (a chat template writes any special "
                "tokens itself)",
                field,
            )
        chat = chat_from_proto(request.chat)
        return await router.prompts.chat(chat.messages, chat.tools, chat.options)
    add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
    return await router.prompts.tokenize(request.text, "text", add_special)


async def _unary(
    router: Router,
    request: Any,
    context: grpc.aio.ServicerContext,
    answer: Callable[[], Awaitable[R]],
    ended: R,
) -> R:
    """A unary call about the model: a request that did not parse or names another model,
    or ``answer`` refusing it, ends the call with its status (``ended`` goes back to a call
    that has ended: nobody reads it)."""
    try:
        if (bad := _undecodable(request)) is not None:
            raise bad
        router.check_model(request.model)
        return await answer()
    except RequestError as e:
        await _abort(context, e)
        return ended


class GenerationServicer(pb_grpc.GenerationServiceServicer):
    def __init__(self, router: Router) -> None:
        self.router = router

    async def Generate(  # gRPC method names are CamelCase
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        router = self.router
        try:
            if (bad := _undecodable(request)) is not None:
                raise bad
            router.check_model(request.model)
            try:
                params = sampling_params_from_proto(request.sampling_params)
            except ValueError as e:
                raise invalid_argument(e) from None
            kind = request.WhichOneof("prompt")
            chat = chat_from_proto(request.chat) if kind == "chat" else None
            if chat is not None:
                params = chat.sampling_params(params)
            prompt: str | list[int] | None = None
            if kind == "text":
                prompt = request.text
            elif kind == "token_ids":
                prompt = list(request.token_ids.ids)
            n = request.n or 1
            runs = request.best_of or n
            if n < 1 or runs < n:
                raise RequestError(
                    ErrorKind.INVALID,
                    f"n and best_of: need 1 <= n <= best_of, got n={n}, best_of={runs}",
                    "n" if n < 1 else "best_of",
                )
            router.check_fanout(1, n, runs)
            if request.request_id:
                check_request_id(request.request_id)
            greq = await router.prepare(
                params,
                prompt=prompt,
                messages=chat.messages if chat is not None else None,
                priority=request.priority,
                request_id=request.request_id or None,
                tools=chat.tools if chat is not None else None,
                chat_options=chat.options if chat is not None else DEFAULT_CHAT_OPTIONS,
            )
            if runs > n and params.logprobs is None:
                greq = router.with_logprobs(greq)
            slot = router.admit()
        except RequestError as e:
            router.metrics.rejected(e)
            await _abort(context, e)
            return
        sequences = expand([greq], runs)
        tool_calls = ToolCallsOut(chat.forced) if chat is not None and chat.parses_tools else None
        with slot:
            deadline = router.deadline(context.time_remaining())
            try:
                if runs == n:
                    async for index, out in stream_all(router, sequences, deadline):
                        msg = delta_to_proto(out)
                        msg.index = index
                        if tool_calls is not None:
                            tool_calls.apply(index, out, out.new_text, msg)
                        yield msg
                    return
                finals = {}
                async for index, out in stream_all(router, sequences, deadline):
                    if out.finished:
                        finals[index] = out
                chosen = best_of(finals, sequences, n, params.logprobs is not None)
                for index, out in sorted(chosen.items()):
                    msg = delta_to_proto(
                        dataclasses.replace(
                            out,
                            new_token_ids=out.token_ids,
                            new_text=out.text,
                            new_logprobs=out.logprobs,
                        )
                    )
                    msg.index = index
                    if tool_calls is not None:
                        tool_calls.apply(index, out, out.text, msg)
                    yield msg
            except RequestError as e:
                await _abort(context, e)

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        router = self.router

        async def answer() -> pb.TokenizeResponse:
            ids = await _tokenize(router, request)
            return pb.TokenizeResponse(token_ids=ids, tokens=router.backend.token_strings(ids))

        return await _unary(router, request, context, answer, pb.TokenizeResponse())

    async def Detokenize(
        self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DetokenizeResponse:
        router = self.router

        async def answer() -> pb.DetokenizeResponse:
            text = await router.detokenize(list(request.token_ids), "token_ids")
            return pb.DetokenizeResponse(text=text)

        return await _unary(router, request, context, answer, pb.DetokenizeResponse())

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfo:
        backend = self.router.backend
        info = backend.model_info()
        load = backend.load()
        admission = self.router.admission
        return pb.ModelInfo(
            model=info.model,
            architecture=info.architecture,
            dtype=info.dtype,
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            block_size=info.block_size,
            eos_token_ids=info.eos_token_ids,
            server_version=pdserve.__version__,
            load=pb.Load(
                num_blocks=load.num_blocks,
                num_free_blocks=load.num_free_blocks,
                num_running_requests=load.num_running_requests,
                num_waiting_requests=load.num_waiting_requests,
                num_inflight_requests=admission.num_inflight,
                max_inflight_requests=admission.max_inflight,
            ),
        )


class GrpcServer:
    """The aio server with the generation, health and reflection services on one port."""

    def __init__(
        self,
        router: Router,
        address: str,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tls: ServerTls | None = None,
        connections: GrpcConnectionPolicy | None = None,
    ) -> None:
        """``interceptors``: e.g. API keys (router.auth_grpc); ``tls``: serve TLS only;
        ``connections``: keepalive and connection age (router.grpc_connections)."""
        # A request HTTP would read fits here too (grpc's own default is 4 MiB, below what a
        # long-context model's prompt may need); beyond it grpc refuses the message with
        # RESOURCE_EXHAUSTED before reading it, as HTTP answers 413.
        limit = router.limits.max_body_bytes
        options = [
            ("grpc.max_receive_message_length", limit),
            *(connections or GrpcConnectionPolicy()).server_options(),
            EXCLUSIVE_PORT,
        ]
        self.server = grpc.aio.server(interceptors=list(interceptors), options=options)
        self._add_generation_service(GenerationServicer(router))
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = add_port(self.server, address, tls)  # OSError naming the address

    def _add_generation_service(self, servicer: GenerationServicer) -> None:
        # What pb_grpc.add_GenerationServiceServicer_to_server does, with lenient parsing.
        handlers = {
            "Generate": grpc.unary_stream_rpc_method_handler(
                servicer.Generate,
                request_deserializer=_lenient(pb.GenerateRequest.FromString),
                response_serializer=pb.GenerateResponse.SerializeToString,
            ),
            "Tokenize": grpc.unary_unary_rpc_method_handler(
                servicer.Tokenize,
                request_deserializer=_lenient(pb.TokenizeRequest.FromString),
                response_serializer=pb.TokenizeResponse.SerializeToString,
            ),
            "Detokenize": grpc.unary_unary_rpc_method_handler(
                servicer.Detokenize,
                request_deserializer=_lenient(pb.DetokenizeRequest.FromString),
                response_serializer=pb.DetokenizeResponse.SerializeToString,
            ),
            "GetModelInfo": grpc.unary_unary_rpc_method_handler(
                servicer.GetModelInfo,
                request_deserializer=_lenient(pb.GetModelInfoRequest.FromString),
                response_serializer=pb.ModelInfo.SerializeToString,
            ),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
        self.server.add_registered_method_handlers(SERVICE_NAME, handlers)

    async def start(self) -> None:
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        """Report NOT_SERVING, then let in-flight calls finish for up to ``grace_s``."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
