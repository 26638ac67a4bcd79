"""``Drain.serving`` around a handler on a real gRPC server: a request that fails has let go of
its request id before its status reaches the client, so a client that retries at once with the
same id is answered as a new request, never with "already in flight"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from pdserve.worker_process import Drain, RequestFailed


@dataclass
class _Drained:
    """A server whose one handler fails every request inside ``drain.serving``, after a
    clean-up that waits; ``cleanups`` lists the ids whose clean-up has run, in order."""

    drain: Drain = field(default_factory=lambda: Drain("test worker"))
    cleanups: list[str] = field(default_factory=list)
    call: Any = None  # the client's callable for the method


@asynccontextmanager
async def _drained() -> AsyncIterator[_Drained]:
    d = _Drained()

    async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        rid = request.decode()
        async with d.drain.serving(rid, context):
            try:
                raise RequestFailed(grpc.StatusCode.UNAVAILABLE, f"{rid}: the transfer failed")
            finally:
                await asyncio.sleep(0.2)  # clean-up that waits (engine abort, connector job)
                d.cleanups.append(rid)

    handler = grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=bytes, response_serializer=bytes
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("pdserve.test.Drained", {"Call": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            d.call = channel.unary_unary("/pdserve.test.Drained/Call")
            yield d
    finally:
        await server.stop(None)


def test_a_failed_request_lets_go_of_its_id_before_the_client_sees_the_status() -> None:
    async def scenario() -> None:
        async with _drained() as d:
            for attempt in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await d.call(b"same-id", timeout=10)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
                assert info.value.details() == "same-id: the transfer failed"
                # The handler's clean-up ran before the status went out.
                assert d.cleanups == ["same-id"] * (attempt + 1)
                assert d.drain.num_in_flight == 0

    asyncio.run(scenario())


def test_a_request_id_in_flight_is_refused_and_the_first_one_is_untouched() -> None:
    async def scenario() -> None:
        async with _drained() as d:
            first = asyncio.ensure_future(d.call(b"twice", timeout=10))
            while d.drain.num_in_flight == 0:
                await asyncio.sleep(0.005)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await d.call(b"twice", timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'twice' is already in flight on this test worker" in (
                info.value.details() or ""
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await first
            assert info.value.details() == "twice: the transfer failed"
            assert d.cleanups == ["twice"]

    asyncio.run(scenario())
