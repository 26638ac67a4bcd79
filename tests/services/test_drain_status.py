"""``Drain.serving`` around a handler on a real gRPC server: a request that fails has let go of
its request id before its status reaches the client, so a client that retries at once with the
same id is answered as a new request, never with "already in flight"."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pdserve.worker_process import Drain, RequestFailed

_METHOD = "/pdserve.test.Drained/Call"


async def _serve(drain: Drain, cleanups: list[str]) -> tuple[grpc.aio.Server, int]:
    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        rid = request.decode()
        async with drain.serving(rid, context):
            try:
                raise RequestFailed(grpc.StatusCode.UNAVAILABLE, f"{rid}: the transfer failed")
            finally:
                await asyncio.sleep(0.2)  # clean-up that waits (engine abort, connector job)
                cleanups.append(rid)

    handler = grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=bytes, response_serializer=bytes
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("pdserve.test.Drained", {"Call": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def test_a_failed_request_lets_go_of_its_id_before_the_client_sees_the_status() -> None:
    async def scenario() -> None:
        drain = Drain("test worker")
        cleanups: list[str] = []
        server, port = await _serve(drain, cleanups)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(_METHOD)
                for attempt in range(3):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await call(b"same-id", timeout=10)
                    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
                    assert info.value.details() == "same-id: the transfer failed"
                    # The handler's clean-up ran before the status went out.
                    assert cleanups == ["same-id"] * (attempt + 1)
                    assert drain.num_in_flight == 0
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_a_request_id_in_flight_is_refused_and_the_first_one_is_untouched() -> None:
    async def scenario() -> None:
        drain = Drain("test worker")
        cleanups: list[str] = []
        server, port = await _serve(drain, cleanups)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(_METHOD)
                first = asyncio.ensure_future(call(b"twice", timeout=10))
                while drain.num_in_flight == 0:
                    await asyncio.sleep(0.005)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(b"twice", timeout=10)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "'twice' is already in flight on this test worker" in (
                    info.value.details() or ""
                )
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await first
                assert info.value.details() == "twice: the transfer failed"
                assert cleanups == ["twice"]
        finally:
            await server.stop(None)

    asyncio.run(scenario())
