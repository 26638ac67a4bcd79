"""Many concurrent transfers with random aborts from both sides and short leases: every
reservation ends exactly once, every block comes back, and completed requests hold the exact
bytes. In this process (TCP over loopback sockets, and in-process), seeded, bounded in time."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from kv_harness import SENTINEL, SPEC, DecodeState

from kv_transfer import KVSender, KVTransferError, create_receiver

NUM_BLOCKS = 64
NUM_REQUESTS = 40


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_random_aborts_and_expiries_leave_everything_released(transport, aio):
    async def scenario() -> None:
        rng = random.Random(7)
        state = DecodeState(NUM_BLOCKS)
        endings: dict[str, int] = {}
        complete, released = state.on_transfer_complete, state.on_reservation_released

        def on_complete(result):  # type: ignore[no-untyped-def]
            endings[result.request_id] = endings.get(result.request_id, 0) + 1
            complete(result)

        def on_released(request_id, block_ids, reason, num_intact):  # type: ignore[no-untyped-def]
            endings[request_id] = endings.get(request_id, 0) + 1
            released(request_id, block_ids, reason, num_intact)

        state.on_transfer_complete = on_complete  # type: ignore[method-assign]
        state.on_reservation_released = on_released  # type: ignore[method-assign]
        dst = np.full(SPEC.pool_shape(NUM_BLOCKS), SENTINEL, np.float32)
        src = np.random.default_rng(3).standard_normal(SPEC.pool_shape(32)).astype(np.float32)
        receiver = create_receiver(SPEC, dst, state, transport, default_lease_s=5.0)
        await receiver.start()
        sender = KVSender(SPEC, src)
        capacity = asyncio.Semaphore(8)  # at most 8 x 6 blocks reserved at once

        async def one(r: int) -> None:
            rid = f"s{r}"
            async with capacity:
                n = rng.randint(1, 6)
                ids = state.allocate(n)
                state.owned[rid] = ids
                event = state._event(rid)
                fate = rng.choice(["finish", "finish", "abort_p", "abort_d", "expire"])
                lease = 0.05 if fate == "expire" else None
                ticket = receiver.reserve(rid, ids, lease_s=lease)
                src_ids = rng.sample(range(32), n)
                transfer = await sender.open(ticket)
                try:
                    if fate == "expire":
                        await asyncio.wait_for(event.wait(), 5.0)
                    for i in range(n - 1):
                        transfer.push([i], [src_ids[i]])
                    if fate == "abort_p":
                        await transfer.abort("random")
                    elif fate == "abort_d":
                        receiver.abort(rid)
                    await transfer.finish(r, -1.0, [n - 1], [src_ids[n - 1]])
                except KVTransferError:
                    assert fate != "finish", rid
                await asyncio.wait_for(event.wait(), 5.0)
                if state.outcomes[rid][0] == "complete":
                    assert fate == "finish"
                    got = dst[ids]
                    assert np.array_equal(got, src[src_ids]), rid
                    dst[ids] = SENTINEL
                    state.free_request(rid)
                receiver.core.table.check_integrity()

        await asyncio.wait_for(asyncio.gather(*(one(r) for r in range(NUM_REQUESTS))), 60.0)
        assert endings == {f"s{r}": 1 for r in range(NUM_REQUESTS)}
        assert receiver.num_reservations() == 0 and sorted(state.free) == list(range(NUM_BLOCKS))
        assert sender.num_active_transfers == 0
        await sender.close()
        await receiver.close()

    aio.run(scenario(), timeout=90)
