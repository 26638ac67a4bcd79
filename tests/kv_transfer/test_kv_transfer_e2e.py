"""End-to-end KV transfer: decode worker in another process (TCP, UCX) or in this one (in-process).
A peer process killed mid-transfer: test_kv_transfer_peer_loss.py.

The prefill side runs in the test process on a session-wide event loop (see conftest.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from kv_harness import (
    SENTINEL,
    SPEC,
    ChildDecode,
    DecodeWorker,
    LocalDecode,
    assert_all_free,
    reserve,
)

from engine.block_hash import hash_block_tokens
from engine.kv_cache_spec import KVCacheSpec
from kv_transfer import (
    IncompatiblePeerError,
    KVSender,
    ReservationTicket,
    TransferRefusedError,
    is_ucx_available,
)

DEFAULT_LEASE_S = 10.0
TRANSPORTS = [
    "tcp",
    pytest.param(
        "ucx", marks=pytest.mark.skipif(not is_ucx_available(), reason="ucxx not installed")
    ),
    "inproc",
]


@pytest.fixture(scope="module", params=TRANSPORTS)
def decode(request: pytest.FixtureRequest, aio: Any) -> Iterator[Any]:
    if request.param == "inproc":

        async def start() -> LocalDecode:
            worker = DecodeWorker("inproc", DEFAULT_LEASE_S)
            await worker.start()
            return LocalDecode(worker)

        local = aio.run(start())
        local.transport = "inproc"
        yield local
        aio.run(local.worker.receiver.close())
    else:
        child = ChildDecode(request.param, DEFAULT_LEASE_S)
        child.transport = request.param  # type: ignore[attr-defined]
        yield child
        child.close()


def src_bytes(src_pool: torch.Tensor, ids: list[int]) -> bytes:
    return src_pool[ids].numpy().tobytes()


def test_blocks_arrive_byte_exact_and_cached_blocks_are_skipped(decode, src_pool, aio):
    tokens = list(range(100, 100 + 7 * SPEC.block_size))
    hashes = hash_block_tokens(tokens, SPEC.block_size)

    async def scenario() -> None:
        sender = KVSender(SPEC, src_pool)
        ticket = await reserve(decode, "exact", 7, {0: hashes[0], 1: hashes[1]})
        to_send = ticket.blocks_to_send(hashes)
        assert to_send == [2, 3, 4, 5, 6]
        src_ids = [9, 3, 4, 20, 11]  # 3, 4 contiguous here; decode's ids are scattered
        src_of = dict(zip(to_send, src_ids, strict=True))
        transfer = await sender.open(ticket)
        await transfer.push([2, 3], [src_of[2], src_of[3]])
        await transfer.push([4, 5], [src_of[4], src_of[5]])
        await transfer.finish(4242, -0.25, [6], [src_of[6]])
        outcome = await decode.call("wait", "exact", 10.0)
        assert outcome == ("complete", 4242, -0.25)
        received = await decode.call("read", [ticket.block_ids[i] for i in to_send])
        assert received == src_bytes(src_pool, src_ids)
        cached = np.frombuffer(
            await decode.call("read", [ticket.block_ids[0], ticket.block_ids[1]]), np.float32
        )
        assert (cached == SENTINEL).all()  # cached blocks were never written
        await decode.call("write_sentinel", list(ticket.block_ids))
        await decode.call("free", "exact")
        await assert_all_free(decode, sender)
        snapshot = sender.metrics.snapshot()
        assert snapshot.blocks_transferred == 5 and snapshot.blocks_skipped == 2
        assert snapshot.bytes_transferred == 5 * SPEC.bytes_per_block
        assert snapshot.transfers_completed == 1
        await sender.close()

    aio.run(scenario())


def test_chunked_pushes_interleave_across_concurrent_requests(decode, src_pool, aio):
    num_requests, chunks, per_chunk = 4, 3, 2

    async def one_request(sender: KVSender, r: int) -> tuple[ReservationTicket, list[int]]:
        ticket = await reserve(decode, f"inter-{r}", chunks * per_chunk)
        src_ids = [r * 8 + k for k in range(chunks * per_chunk)]
        transfer = await sender.open(ticket)
        for c in range(chunks - 1):
            idx = list(range(c * per_chunk, (c + 1) * per_chunk))
            await transfer.push(idx, [src_ids[i] for i in idx])
        last = list(range((chunks - 1) * per_chunk, chunks * per_chunk))
        await transfer.finish(r, float(-r), last, [src_ids[i] for i in last])
        return ticket, src_ids

    async def scenario() -> None:
        sender = KVSender(SPEC, src_pool)
        before = len((await decode.call("state"))["push_log"])
        results = await asyncio.gather(*(one_request(sender, r) for r in range(num_requests)))
        for r, (ticket, src_ids) in enumerate(results):
            assert await decode.call("wait", f"inter-{r}", 10.0) == ("complete", r, float(-r))
            received = await decode.call("read", list(ticket.block_ids))
            assert received == src_bytes(src_pool, src_ids)
            await decode.call("write_sentinel", list(ticket.block_ids))
            await decode.call("free", f"inter-{r}")
        log = (await decode.call("state"))["push_log"][before:]
        assert sorted(log) == sorted(f"inter-{r}" for r in range(num_requests) for _ in range(3))
        # Interleaved: some request's chunks are not consecutive in arrival order.
        runs = sum(1 for k in range(1, len(log)) if log[k] != log[k - 1]) + 1
        assert runs > num_requests, log
        await assert_all_free(decode, sender)
        await sender.close()

    aio.run(scenario())


def test_abort_mid_transfer_from_either_side_frees_both(decode, src_pool, aio):
    async def scenario() -> None:
        sender = KVSender(SPEC, src_pool)
        # Prefill aborts after the first chunk.
        ticket = await reserve(decode, "abort-p", 4)
        transfer = await sender.open(ticket)
        await transfer.push([0, 1], [0, 1])
        await transfer.abort("client went away")
        assert (await decode.call("wait", "abort-p", 10.0))[0] == "aborted"
        assert sender.num_active_transfers == 0
        await transfer.abort()  # idempotent
        # Decode aborts after the first chunk: the next write is refused, never applied.
        ticket = await reserve(decode, "abort-d", 4)
        transfer = await sender.open(ticket)
        await transfer.push([0, 1], [0, 1])
        assert await decode.call("abort", "abort-d") is True
        assert (await decode.call("wait", "abort-d", 10.0))[0] == "aborted"
        with pytest.raises(TransferRefusedError) as refused:
            await transfer.push([2, 3], [2, 3])
        assert refused.value.status == "KV_STATUS_UNKNOWN_RESERVATION"
        with pytest.raises(TransferRefusedError):
            await transfer.renew()
        # A push nobody awaited fails the same way: finish re-raises that failure.
        ticket = await reserve(decode, "abort-d2", 4)
        transfer = await sender.open(ticket)
        await decode.call("abort", "abort-d2")
        transfer.push([0, 1], [0, 1])
        with pytest.raises(TransferRefusedError, match="UNKNOWN_RESERVATION"):
            await transfer.finish(0, 0.0, [2, 3], [2, 3])
        state = await assert_all_free(decode, sender)
        assert state["metrics"].refused_writes.get("KV_STATUS_UNKNOWN_RESERVATION", 0) >= 1
        await decode.call("write_sentinel", list(range(64)))
        await sender.close()

    aio.run(scenario())


def test_lease_expiry_frees_both_sides(decode, src_pool, aio):
    async def scenario() -> None:
        sender = KVSender(SPEC, src_pool)
        ticket = await reserve(decode, "lease", 4, lease_s=1.5)
        transfer = await sender.open(ticket)
        await transfer.renew()  # a live reservation renews fine
        await transfer.push([0], [0])
        start = time.monotonic()
        assert (await decode.call("wait", "lease", 10.0))[0] == "expired"
        assert time.monotonic() - start < 6.0
        with pytest.raises(TransferRefusedError):
            await transfer.push([1], [1])
        await assert_all_free(decode, sender)
        await decode.call("write_sentinel", list(range(64)))
        await sender.close()

    aio.run(scenario())


def test_forged_token_and_foreign_blocks_are_refused_and_counted(decode, src_pool, aio):
    tokens = list(range(3 * SPEC.block_size))
    hashes = hash_block_tokens(tokens, SPEC.block_size)

    async def scenario() -> None:
        sender = KVSender(SPEC, src_pool)
        before = (await decode.call("state"))["metrics"].num_refused_writes
        a = await reserve(decode, "ref-a", 3)
        b = await reserve(decode, "ref-b", 3)
        c = await reserve(decode, "ref-c", 3, {0: hashes[0]})
        forged = dataclasses.replace(a, token=os.urandom(16))
        with pytest.raises(TransferRefusedError) as e1:
            await (await sender.open(forged)).push([0], [0])
        assert e1.value.status == "KV_STATUS_BAD_TOKEN"
        foreign = dataclasses.replace(a, block_ids=b.block_ids)  # a's token, b's blocks
        with pytest.raises(TransferRefusedError) as e2:
            await (await sender.open(foreign)).push([0, 1], [0, 1])
        assert e2.value.status == "KV_STATUS_FOREIGN_BLOCK"
        shared = dataclasses.replace(c, cached_blocks={})  # tries to overwrite a cached block
        with pytest.raises(TransferRefusedError) as e3:
            await (await sender.open(shared)).push([0], [0])
        assert e3.value.status == "KV_STATUS_FOREIGN_BLOCK"
        untouched = np.frombuffer(
            await decode.call("read", list(b.block_ids) + list(c.block_ids)), np.float32
        )
        assert (untouched == SENTINEL).all()
        # The connection survived the refusals: a legitimate transfer still completes.
        transfer = await sender.open(a)
        await transfer.finish(1, -1.0, [0, 1, 2], [5, 6, 7])
        assert (await decode.call("wait", "ref-a", 10.0))[0] == "complete"
        assert await decode.call("read", list(a.block_ids)) == src_bytes(src_pool, [5, 6, 7])
        refused = (await decode.call("state"))["metrics"].num_refused_writes - before
        assert refused == 3
        for rid in ("ref-b", "ref-c"):
            await decode.call("abort", rid)
        await decode.call("free", "ref-a")
        await decode.call("write_sentinel", list(range(64)))
        await assert_all_free(decode, sender)
        await sender.close()

    aio.run(scenario())


def test_duplicate_and_late_messages_are_idempotent(decode, src_pool, aio):
    """A retried sender repeats a push (harmless) and a final message after completion
    (refused, never applied); aborting twice is a no-op."""

    async def scenario() -> None:
        sender = KVSender(SPEC, src_pool)
        ticket = await reserve(decode, "dup", 2)
        first, retry = await sender.open(ticket), await sender.open(ticket)
        await first.push([0], [4])
        await retry.push([0], [4])  # duplicate of the same block: accepted, counted once
        await first.finish(9, -0.5, [1], [5])
        assert await decode.call("wait", "dup", 10.0) == ("complete", 9, -0.5)
        with pytest.raises(TransferRefusedError, match="UNKNOWN_RESERVATION"):
            await retry.finish(9, -0.5, [1], [5])  # late: the blocks now belong to decode
        assert await decode.call("read", list(ticket.block_ids)) == src_bytes(src_pool, [4, 5])
        await decode.call("write_sentinel", list(ticket.block_ids))
        await decode.call("free", "dup")
        assert await decode.call("abort", "dup") is False
        await assert_all_free(decode, sender)
        await sender.close()

    aio.run(scenario())


def test_fingerprint_mismatch_is_refused_with_a_clear_error(decode, aio):
    other = dataclasses.replace(SPEC, num_layers=3)

    async def scenario() -> None:
        before = (await decode.call("state"))["metrics"].refused_writes
        sender = KVSender(other, np.zeros(other.pool_shape(4), np.float32))
        ticket = await reserve(decode, "mismatch", 2)
        with pytest.raises(IncompatiblePeerError, match=r"num_layers: 2 != 3"):
            await sender.open(ticket)
        assert sender.metrics.snapshot().failures == {"IncompatiblePeerError": 1}
        after = (await decode.call("state"))["metrics"].refused_writes
        assert after.get("KV_STATUS_INCOMPATIBLE", 0) == before.get("KV_STATUS_INCOMPATIBLE", 0) + 1
        await decode.call("abort", "mismatch")
        await assert_all_free(decode)
        await sender.close()

    aio.run(scenario())


def test_spec_mismatch_between_pool_and_spec_is_rejected():
    bad = np.zeros(KVCacheSpec(2, 2, 8, 4, "float32").pool_shape(2), np.float16)
    with pytest.raises(ValueError, match="dtype"):
        KVSender(SPEC, bad)
