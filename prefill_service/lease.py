"""Keeping decode's reservation alive while this worker holds the request.

Decode releases a reservation nobody writes to or renews for one lease. Between the ticket
and the last block a request may wait in this worker's queue for much longer than that, so
the prefill servicer renews every third of a lease, but only while its engine is making
progress: a hung engine stops renewing and decode reclaims the blocks within a lease.

    open(ticket) ─▶ renew ─ lease/3 ─▶ renew ─ lease/3 ─▶ ... ─▶ (prompt done) finish
"""

from __future__ import annotations

import asyncio

from engine.async_engine import AsyncEngine
from kv_transfer import OutgoingTransfer


async def keep_alive(transfer: OutgoingTransfer, engine: AsyncEngine) -> None:
    """Renew ``transfer``'s lease until cancelled. Returns nothing; raises what a renewal
    raises (``TransferRefusedError`` once decode has released the reservation, so the caller
    can stop working on a request nobody waits for), or ``TimeoutError`` when the engine
    made no step for a whole lease."""
    lease_s = transfer.ticket.lease_s
    loop = asyncio.get_running_loop()
    steps, progressed = engine.stats.num_steps, loop.time()
    while True:
        now = loop.time()
        if engine.stats.num_steps != steps:
            steps, progressed = engine.stats.num_steps, now
        if now - progressed >= lease_s or not engine.is_running:
            raise TimeoutError(f"the prefill engine made no progress for {lease_s:g}s")
        await transfer.renew()
        await asyncio.sleep(lease_s / 3)
