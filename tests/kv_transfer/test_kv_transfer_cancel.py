"""Defect 2 of issue 12: cancelling one request's transfer never breaks the connection that
other requests' transfers share (the router logged "KV transfer: connection lost: call
cancelled" for requests nobody cancelled).

A prefill worker's pushes for every request to one decode worker share one channel. Here the
task pushing request A is cancelled at every point of its exchange in turn (after 0, 1, 2, ...
event-loop turns) while request B's transfer runs on the same channel: B must complete, the
channel must stay open, and A's abort must free A's blocks on both sides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from kv_harness import SPEC, ChildDecode

from kv_transfer import KVSender, ReservationTicket, is_ucx_available
from kv_transfer.sender import OutgoingTransfer
from protos.pdserve.v1 import kv_transfer_pb2 as pb

TRANSPORTS = [
    "tcp",
    pytest.param(
        "ucx", marks=pytest.mark.skipif(not is_ucx_available(), reason="ucxx not installed")
    ),
]
NUM_TURNS = 8  # cancel points tried: more than an exchange takes (UCX: 4 awaits)


@pytest.fixture(scope="module", params=TRANSPORTS)
def decode(request: pytest.FixtureRequest) -> Iterator[ChildDecode]:
    child = ChildDecode(request.param, 30.0)
    yield child
    child.close()


async def _reserve(decode: ChildDecode, request_id: str, n: int) -> ReservationTicket:
    data = await decode.call("reserve", request_id, n, {}, None)
    return ReservationTicket.from_proto(pb.KVReservation.FromString(data))


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_cancelled_push_leaves_the_shared_channel_working(decode: ChildDecode, aio: Any):
    src = torch.randn(SPEC.pool_shape(32), generator=torch.Generator().manual_seed(5))

    async def scenario() -> None:
        sender = KVSender(SPEC, src)
        for turns in range(NUM_TURNS):
            a = await sender.open(await _reserve(decode, f"a{turns}", 4))
            b = await sender.open(await _reserve(decode, f"b{turns}", 4))

            async def push_a(a: OutgoingTransfer) -> None:
                await a.push([0, 1], [0, 1])
                await a.finish(1, 0.0, [2, 3], [2, 3])

            task = asyncio.ensure_future(push_a(a))
            b_done = asyncio.ensure_future(b.finish(2, 0.0, [0, 1, 2, 3], [4, 5, 6, 7]))
            await _turns(turns)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await a.abort("the client went away")  # what the prefill servicer does next
            await b_done  # raises if the shared channel was torn down
            outcome_a = await decode.call("wait", f"a{turns}", 10.0)
            assert outcome_a[0] in ("complete", "aborted"), outcome_a
            assert await decode.call("wait", f"b{turns}", 10.0) == ("complete", 2, 0.0)
            for rid in (f"a{turns}", f"b{turns}"):
                await decode.call("free", rid)  # a completed transfer's blocks are the owner's
            state = await decode.call("state")
            assert state["num_reservations"] == 0 and state["num_free"] == 64, state
            assert sender.num_active_transfers == 0
        await sender.close()

    aio.run(scenario())
