"""Test harness: a decode worker (receiver + a tiny block allocator) in a child process or in this
one, and a prefill worker that can run in a child process to be killed.

Children are started with the ``spawn`` method (UCX must be initialised after any fork) and use
numpy pools, so they start without importing torch. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.kv_cache_spec import KVCacheSpec
from kv_transfer import (
    CompletedTransfer,
    KVSender,
    ReleaseReason,
    ReservationTicket,
    create_receiver,
    release_transports,
)
from kv_transfer.receiver import ReceiverBase
from protos.pdserve.v1 import kv_transfer_pb2 as pb

SPEC = KVCacheSpec(
    num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype="float32", model_id="test"
)
NUM_BLOCKS = 64
RPC_TIMEOUT_S = 30.0
SENTINEL = 7.0  # the value decode's blocks hold until something writes them


@dataclass
class DecodeState:
    """The decode worker's owner: allocates blocks, frees them when a reservation ends."""

    num_blocks: int
    free: list[int] = field(default_factory=list)
    owned: dict[str, list[int]] = field(default_factory=dict)
    outcomes: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    push_log: list[str] = field(default_factory=list)
    events: dict[str, asyncio.Event] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free = list(range(self.num_blocks))

    def allocate(self, n: int) -> list[int]:
        # Scattered, non-monotonic ids: the tests must not depend on contiguity.
        rng = np.random.default_rng(len(self.free) * 7919 + n)
        picks = [int(i) for i in rng.choice(len(self.free), size=n, replace=False)]
        ids = [self.free[i] for i in picks]
        for b in ids:
            self.free.remove(b)
        return ids

    def _event(self, request_id: str) -> asyncio.Event:
        return self.events.setdefault(request_id, asyncio.Event())

    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        self.outcomes[result.request_id] = (
            "complete",
            result.first_token_id,
            result.first_token_logprob,
        )
        self._event(result.request_id).set()  # blocks stay owned until the test frees them

    def on_reservation_released(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        reason: ReleaseReason,
        num_intact_blocks: int,
    ) -> None:
        self.outcomes[request_id] = (reason.value, 0, 0.0)
        self.free_request(request_id)
        self._event(request_id).set()

    def free_request(self, request_id: str) -> None:
        for b in self.owned.pop(request_id, []):
            self.free.append(b)


class DecodeWorker:
    """Receiver + allocator + the commands the tests send (same in a child or in-process)."""

    def __init__(self, transport: str, lease_s: float, spec: KVCacheSpec = SPEC) -> None:
        self.spec = spec
        self.pool = np.full(spec.pool_shape(NUM_BLOCKS), SENTINEL, dtype=np.float32)
        self.state = DecodeState(NUM_BLOCKS)
        self.receiver: ReceiverBase = create_receiver(
            spec, self.pool, self.state, transport, default_lease_s=lease_s
        )
        begin_push = self.receiver.core.begin_push

        def logged_begin_push(push: pb.KVPush, peer: Any) -> Any:
            self.state.push_log.append(push.request_id)
            return begin_push(push, peer)

        self.receiver.core.begin_push = logged_begin_push  # type: ignore[method-assign]

    async def start(self) -> str:
        await self.receiver.start()
        return self.receiver.endpoint

    async def handle(self, command: str, *args: Any) -> Any:
        state = self.state
        if command == "reserve":
            request_id, num_blocks, cached, lease_s = args
            ids = state.allocate(num_blocks)
            state.owned[request_id] = ids
            state._event(request_id)
            ticket = self.receiver.reserve(request_id, ids, cached, lease_s)
            return ticket.to_proto().SerializeToString()
        if command == "wait":
            request_id, timeout = args
            event = state._event(request_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
            return state.outcomes.get(request_id)
        if command == "read":
            (ids,) = args
            return self.pool[list(ids)].tobytes()
        if command == "write_sentinel":
            (ids,) = args
            self.pool[list(ids)] = SENTINEL
            return None
        if command == "free":
            (request_id,) = args
            state.free_request(request_id)
            return None
        if command == "abort":
            (request_id,) = args
            return self.receiver.abort(request_id)
        if command == "state":
            self.receiver.core.table.check_integrity()
            return {
                "num_reservations": self.receiver.num_reservations(),
                "num_free": len(state.free),
                "metrics": self.receiver.metrics.snapshot(),
                "push_log": list(state.push_log),
            }
        raise ValueError(command)


def _decode_main(conn: Any, transport: str, lease_s: float) -> None:
    async def main() -> None:
        worker = DecodeWorker(transport, lease_s)
        conn.send(await worker.start())
        loop = asyncio.get_running_loop()
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            if message is None:
                break
            command, args = message
            try:
                result = ("ok", await worker.handle(command, *args))
            except Exception as e:  # report to the test instead of dying silently
                result = ("error", repr(e))
            conn.send(result)
        await worker.receiver.close()
        await release_transports()  # UCX's notifier thread would keep the process alive

    asyncio.run(main())


class ChildDecode:
    """A decode worker in a spawned process, driven over a pipe."""

    def __init__(self, transport: str, lease_s: float) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._lock = threading.Lock()  # one command at a time on the pipe
        self.process = ctx.Process(target=_decode_main, args=(child, transport, lease_s))
        self.process.start()
        if not self._conn.poll(RPC_TIMEOUT_S):
            self.process.kill()
            raise TimeoutError("decode worker did not start")
        self.endpoint: str = self._conn.recv()

    def call_sync(self, command: str, *args: Any) -> Any:
        with self._lock:
            self._conn.send((command, args))
            if not self._conn.poll(RPC_TIMEOUT_S):
                raise TimeoutError(f"decode worker did not answer {command}")
            status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"decode worker: {command} failed: {value}")
        return value

    async def call(self, command: str, *args: Any) -> Any:
        return await asyncio.to_thread(self.call_sync, command, *args)

    def close(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(None)
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


class LocalDecode:
    """The same worker in this process and event loop (the in-process transport)."""

    def __init__(self, worker: DecodeWorker) -> None:
        self.worker = worker
        self.endpoint = worker.receiver.endpoint

    async def call(self, command: str, *args: Any) -> Any:
        return await self.worker.handle(command, *args)


def _prefill_main(conn: Any) -> None:
    """A prefill worker: once ready, takes a ticket, pushes block 0, reports, waits to be killed."""
    from kv_transfer import KVSender, ReservationTicket

    async def main() -> None:
        pool = np.random.default_rng(1).standard_normal(SPEC.pool_shape(8)).astype(np.float32)
        sender = KVSender(SPEC, pool)
        conn.send("ready")
        loop = asyncio.get_running_loop()
        ticket_bytes = await loop.run_in_executor(None, conn.recv)
        ticket = ReservationTicket.from_proto(pb.KVReservation.FromString(ticket_bytes))
        transfer = await sender.open(ticket)
        await transfer.push([0], [0])
        conn.send("pushed")
        await loop.run_in_executor(None, conn.recv)  # killed by the test long before

    asyncio.run(main())


class ChildPrefill:
    """A prefill process, started (and its imports done) before the reservation is made, so a
    short lease is not spent on process start-up."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_prefill_main, args=(child,))
        self.process.start()
        self._expect("ready")

    def push_first_block(self, ticket_bytes: bytes) -> None:
        self._conn.send(ticket_bytes)
        self._expect("pushed")

    def _expect(self, message: str) -> None:
        if not self._conn.poll(RPC_TIMEOUT_S):
            self.process.kill()
            raise TimeoutError(f"prefill worker: no {message!r}")
        assert self._conn.recv() == message


def ticket_of(data: bytes) -> ReservationTicket:
    message = pb.KVReservation()
    message.ParseFromString(data)
    return ReservationTicket.from_proto(message)


async def reserve(
    decode: Any,
    request_id: str,
    n: int,
    cached: dict[int, bytes] | None = None,
    lease_s: float | None = None,
) -> ReservationTicket:
    """Reserve ``n`` blocks on ``decode`` (a ``ChildDecode`` or ``LocalDecode``)."""
    return ticket_of(await decode.call("reserve", request_id, n, cached or {}, lease_s))


async def assert_all_free(decode: Any, sender: KVSender | None = None) -> dict[str, Any]:
    """Decode holds no reservation and every block is free (and ``sender`` no transfer)."""
    state = await decode.call("state")
    assert state["num_reservations"] == 0
    assert state["num_free"] == NUM_BLOCKS
    if sender is not None:
        assert sender.num_active_transfers == 0
    return state
