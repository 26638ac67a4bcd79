"""A peer process killed in the middle of a KV transfer (TCP and UCX; the decode side or the
prefill side in a child process, killed with SIGKILL): the survivor detects it within its
lease or deadline, every call it makes ends with a ``KVTransferError``, and its side is left
fully free."""

from __future__ import annotations

import asyncio
import time

import pytest
from kv_harness import SPEC, ChildDecode, ChildPrefill, assert_all_free, reserve

from kv_transfer import (
    KVSender,
    KVTransferError,
    PeerLostError,
    TransferTimeoutError,
    is_ucx_available,
)

TRANSPORTS = [
    "tcp",
    pytest.param("ucx", marks=pytest.mark.skipif(not is_ucx_available(), reason="no ucxx")),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_prefill_is_detected_within_the_lease(transport, aio):
    # Long enough that connecting and pushing the first block fit in it on a loaded machine.
    lease_s = 5.0
    decode = ChildDecode(transport, lease_s)
    try:

        async def scenario() -> None:
            prefill = await asyncio.to_thread(ChildPrefill)
            data = await decode.call("reserve", "killed-p", 4, {}, None)
            await asyncio.to_thread(prefill.push_first_block, data)
            prefill.process.kill()
            start = time.monotonic()
            outcome = await decode.call("wait", "killed-p", 3 * lease_s)
            elapsed = time.monotonic() - start
            # TCP sees the connection drop at once; UCX (no error handling) at the lease.
            assert outcome[0] in ("peer_lost", "expired"), outcome
            assert elapsed < lease_s + 2.0, elapsed  # slack for a loaded 2-core CI machine
            await assert_all_free(decode)
            await asyncio.to_thread(prefill.process.join, 10)

        aio.run(scenario())
    finally:
        decode.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_decode_is_detected_within_the_lease(transport, src_pool, aio):
    lease_s = 30.0
    # The sender's deadline per wait (by default the ticket's lease). Short enough to prove
    # detection is bounded well inside the lease, long enough for a UCX handshake on a
    # loaded 2-core machine (1.5 s was not: the open itself timed out there).
    timeout_s = 5.0
    decode = ChildDecode(transport, lease_s)
    try:

        async def scenario() -> None:
            sender = KVSender(SPEC, src_pool, timeout_s=timeout_s)
            ticket = await reserve(decode, "killed-d", 4)
            transfer = await sender.open(ticket)
            await transfer.push([0], [0])
            decode.process.kill()
            await asyncio.to_thread(decode.process.join, 10)
            start = time.monotonic()
            with pytest.raises((PeerLostError, TransferTimeoutError)):
                await transfer.push([1], [1])
            assert time.monotonic() - start < timeout_s + 1.0
            assert sender.num_active_transfers == 0
            start = time.monotonic()
            await transfer.abort()  # best effort towards a dead peer: bounded
            assert time.monotonic() - start < 3.0
            assert sender.metrics.snapshot().num_failures >= 1
            await sender.close()

        aio.run(scenario())
    finally:
        decode.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transfer_into_a_killed_decode_ends_and_aborts_cleanly(transport, src_pool, aio):
    """Several requests' transfers into one decode worker when it dies: their aborts all
    reconnect at once and share one connection attempt. Each must see its refusal as a
    KVTransferError and return: once, only the first did, the others got the raw
    ``ConnectionRefusedError`` out of ``abort``, and the prefill job that owned the prompt's
    blocks never ended (the blocks were held for good)."""
    decode = ChildDecode(transport, 30.0)
    try:

        async def scenario() -> None:
            sender = KVSender(SPEC, src_pool, timeout_s=5.0)
            transfers = []
            for i in range(3):
                ticket = await reserve(decode, f"killed-many-{i}", 2)
                transfers.append(await sender.open(ticket))
            await transfers[0].push([0], [0])
            decode.process.kill()
            await asyncio.to_thread(decode.process.join, 10)
            with pytest.raises((PeerLostError, TransferTimeoutError)):
                await transfers[0].push([1], [1])  # the channel is known lost now
            start = time.monotonic()
            pushes = await asyncio.gather(
                *(t.push([1], [1]) for t in transfers[1:]), return_exceptions=True
            )
            assert all(isinstance(p, KVTransferError) for p in pushes), pushes
            outcomes = await asyncio.gather(
                *(t.abort("gone") for t in transfers), return_exceptions=True
            )
            assert outcomes == [None, None, None], outcomes
            assert time.monotonic() - start < 15.0
            assert sender.num_active_transfers == 0
            await sender.close()

        aio.run(scenario())
    finally:
        decode.close()
