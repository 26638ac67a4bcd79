"""Prefill side: pushes a request's finished blocks into the blocks decode reserved.

    sender = KVSender(spec, kv_pool)                  # one per prefill worker
    transfer = await sender.open(ticket)              # handshake on first use of the endpoint
    transfer.push([0, 1, 2], src_block_ids=[7, 8, 9])   # after each chunk: returns a task
    ...                                                  # next chunk's forward pass
    await transfer.finish(first_token_id, first_token_logprob)  # waits for the pushes
    # or: await transfer.abort("client went away")

``push`` starts the send and returns a task at once, so the transfer overlaps the next chunk's
compute; the task ends when decode has written the blocks (then the source blocks may be
reused). ``finish`` waits for every push, then sends the final message. Pushes of
different requests to the same decode worker share one connection and interleave chunk by
chunk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from engine.kv_cache_spec import KVCacheSpec, segment_runs
from kv_transfer.compatibility import compatibility_of
from kv_transfer.errors import (
    KVTransferError,
    PeerLostError,
    TransferIncompleteError,
    TransferRefusedError,
    TransferTimeoutError,
)
from kv_transfer.metrics import TransferMetrics
from kv_transfer.peers import PeerGate
from kv_transfer.pool import PoolBuffer
from kv_transfer.ticket import ReservationTicket
from kv_transfer.transport import Channel, Connector
from kv_transfer.wire import status_name
from protos.pdserve.v1 import kv_transfer_pb2 as pb

logger = logging.getLogger(__name__)

# An abort is best effort: never wait long for a peer that may be dead.
ABORT_TIMEOUT_S = 2.0


class OutgoingTransfer:
    """One request's transfer; created by ``KVSender.open``. Not thread-safe: use it from the
    sender's event loop."""

    def __init__(self, sender: KVSender, ticket: ReservationTicket, timeout_s: float) -> None:
        self.ticket = ticket
        self._sender = sender
        self._timeout_s = timeout_s
        self._pending: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None  # the error that ended the transfer
        self._finished = False  # decode acknowledged the final message
        self._aborted = False
        self._started = time.monotonic()
        self._bytes = 0
        self.is_done = False

    def push(
        self, block_indices: Sequence[int], src_block_ids: Sequence[int]
    ) -> asyncio.Task[None]:
        """Start sending blocks ``block_indices`` of the request, read from this worker's pool
        blocks ``src_block_ids``; returns at once with a task that ends when decode has written
        them (await it before reusing those source blocks, or let ``finish`` wait for it).
        Pushes go out in call order. Raises ``ValueError`` at once for indices the reservation
        does not expect; the task raises ``TransferRefusedError`` (reservation gone, block not
        expected), ``PeerLostError`` or ``TransferTimeoutError``, and the transfer is then over.
        Call from the event loop's thread."""
        indices, src = self._check(block_indices, src_block_ids)
        return self._start_send(indices, src, is_last=False)

    def _start_send(
        self,
        block_indices: list[int],
        src_block_ids: list[int],
        is_last: bool,
        first_token_id: int = 0,
        first_token_logprob: float = 0.0,
    ) -> asyncio.Task[None]:
        # Every send that reads source blocks is a task in _pending, so abort() can wait for
        # it even when the coroutine that started it was cancelled.
        task = asyncio.ensure_future(
            self._send(block_indices, src_block_ids, is_last, first_token_id, first_token_logprob)
        )
        self._pending.add(task)
        task.add_done_callback(self._push_done)
        return task

    def _push_done(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # kept in self._failure; finish re-raises it, nothing is lost

    async def finish(
        self,
        first_token_id: int,
        first_token_logprob: float,
        block_indices: Sequence[int] = (),
        src_block_ids: Sequence[int] = (),
    ) -> None:
        """The final message (optionally with the last blocks): waits for this transfer's
        earlier pushes (re-raising the first failure), then tells decode the first sampled
        token. Returns when decode has every expected block; raises
        ``TransferIncompleteError`` if some were never pushed. Cancelling the caller does not
        cut the final message: ``abort`` then waits for it."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        indices, src = self._check(block_indices, src_block_ids)
        await asyncio.shield(
            self._start_send(indices, src, True, first_token_id, first_token_logprob)
        )
        self._finished = True
        self._done()
        seconds = time.monotonic() - self._started
        self._sender.metrics.record_skipped(len(self.ticket.cached_blocks))
        self._sender.metrics.record_transfer(seconds, self._bytes)

    async def renew(self) -> None:
        """Extend decode's lease (e.g. while this request waits in the prefill queue). Raises
        ``TransferRefusedError`` when decode no longer holds the reservation (it expired, or
        decode aborted it), ``PeerLostError`` or ``TransferTimeoutError``."""
        frame = pb.KVFrame(
            renew=pb.KVRenew(request_id=self.ticket.request_id, token=self.ticket.token)
        )
        await self._call(frame, [])

    async def abort(self, reason: str = "") -> None:
        """Tell decode to release the reservation (best effort, idempotent; also after a
        failure, when decode may still hold it); returns once every push of this transfer has
        stopped reading the source blocks, which the caller may then free."""
        if not self._finished and not self._aborted:
            self._aborted = True
            self._done()
            frame = pb.KVFrame(
                abort=pb.KVAbort(
                    request_id=self.ticket.request_id, token=self.ticket.token, reason=reason
                )
            )
            try:
                await self._call(frame, [], min(self._timeout_s, ABORT_TIMEOUT_S))
            except KVTransferError:
                pass  # the peer is gone: its lease or peer-loss detection frees the reservation
            except Exception:  # a defect; the pushes below must still be waited for
                logger.exception("abort of %s failed", self.ticket.request_id)
        # Pushes already on the wire end by themselves (refused, or each one's deadline);
        # cancelling them could cut a frame in half.
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _check(
        self, block_indices: Sequence[int], src_block_ids: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        if self._failure is not None:
            raise self._failure
        if self.is_done:
            raise KVTransferError(f"transfer of {self.ticket.request_id!r} is already over")
        if len(block_indices) != len(src_block_ids):
            raise ValueError("block_indices and src_block_ids differ in length")
        n = len(self.ticket.block_ids)
        bad = [i for i in block_indices if not 0 <= i < n or i in self.ticket.cached_blocks]
        if bad:
            raise ValueError(f"block indices {bad} are not expected by the reservation")
        return list(block_indices), list(src_block_ids)

    async def _send(
        self,
        block_indices: list[int],
        src_block_ids: list[int],
        is_last: bool,
        first_token_id: int = 0,
        first_token_logprob: float = 0.0,
    ) -> None:
        if self.is_done:
            raise KVTransferError(f"transfer of {self.ticket.request_id!r} is already over")
        dst = [self.ticket.block_ids[i] for i in block_indices]
        runs = segment_runs(src_block_ids, dst)
        pool = self._sender.pool
        payload = []
        k = 0
        for length in runs:
            payload.append(pool.numpy_span(src_block_ids[k], length))
            k += length
        num_bytes = len(block_indices) * pool.bytes_per_block
        frame = pb.KVFrame(
            push=pb.KVPush(
                request_id=self.ticket.request_id,
                token=self.ticket.token,
                block_indices=block_indices,
                block_ids=dst,
                payload_bytes=num_bytes,
                segment_blocks=runs,
                is_last=is_last,
                first_token_id=first_token_id,
                first_token_logprob=first_token_logprob,
            )
        )
        try:
            await self._call(frame, payload)
        except BaseException as e:
            if self._failure is None:
                self._failure = e
            self._done()
            raise
        self._bytes += num_bytes
        self._sender.metrics.record_blocks(len(block_indices), num_bytes)

    async def _call(
        self, frame: pb.KVFrame, payload: list[Any], timeout: float | None = None
    ) -> None:
        timeout = self._timeout_s if timeout is None else timeout
        try:
            channel = await self._sender._channel(self.ticket, timeout)
            reply = await channel.call(frame, payload, timeout)
        except KVTransferError as e:
            self._sender.metrics.record_failure(type(e).__name__)
            raise
        status = reply.ack.status
        if status == pb.KV_STATUS_OK:
            return
        self._sender.metrics.record_failure(status_name(status))
        if status == pb.KV_STATUS_INCOMPLETE:
            raise TransferIncompleteError(f"{self.ticket.request_id}: {reply.ack.error}")
        raise TransferRefusedError(status_name(status), reply.ack.error)

    def _done(self) -> None:
        if not self.is_done:
            self.is_done = True
            self._sender._active.discard(self)


class KVSender:
    """The prefill worker's side of every transfer; owns one channel per decode endpoint."""

    def __init__(
        self,
        spec: KVCacheSpec,
        pool: Any,
        metrics: TransferMetrics | None = None,
        timeout_s: float | None = None,
        connectors: Sequence[Connector] | None = None,
        host: str = "127.0.0.1",
        peers: PeerGate | None = None,
    ) -> None:
        """``pool``: this worker's KV pool (see kv_transfer.pool). ``timeout_s``: deadline of
        each wait; defaults to the ticket's lease (decode frees the blocks after it anyway).
        ``connectors``: the transports to use by scheme; default: every available one, with
        any listener of theirs on ``host``. ``peers``: the only endpoints tickets may name
        (default: any)."""
        from kv_transfer.factory import default_connectors

        self.spec = spec
        self.pool = PoolBuffer(spec, pool)
        self.metrics = metrics or TransferMetrics()
        self._timeout_s = timeout_s
        self._compatibility = compatibility_of(spec)
        self._connectors = {c.scheme: c for c in (connectors or default_connectors(host))}
        self._channels: dict[str, Channel] = {}
        self._connecting: dict[str, asyncio.Future[Channel]] = {}
        self._active: set[OutgoingTransfer] = set()
        self._peers = peers

    async def open(self, ticket: ReservationTicket) -> OutgoingTransfer:
        """Start the transfer described by ``ticket`` (connecting and handshaking with its
        endpoint if no channel is open). Raises ``IncompatiblePeerError`` on a mismatch,
        ``PeerNotAllowedError`` for an endpoint outside ``peers`` (before connecting)."""
        if self._peers is not None and not await self._peers.admits(ticket.endpoint):
            self.metrics.record_failure("PeerNotAllowedError")
            raise self._peers.refusal(ticket.endpoint)
        timeout = self._timeout_s if self._timeout_s is not None else ticket.lease_s
        await self._channel(ticket, timeout)
        transfer = OutgoingTransfer(self, ticket, timeout)
        self._active.add(transfer)
        return transfer

    @property
    def num_active_transfers(self) -> int:
        """Transfers neither finished nor aborted (their source blocks are still in use)."""
        return len(self._active)

    async def close(self) -> None:
        for transfer in list(self._active):
            await transfer.abort("sender closing")
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    async def _channel(self, ticket: ReservationTicket, timeout: float) -> Channel:
        endpoint = ticket.endpoint
        channel = self._channels.get(endpoint)
        if channel is not None and not channel.is_closed:
            return channel
        pending = self._connecting.get(endpoint)
        if pending is not None:
            return await asyncio.shield(pending)
        scheme = endpoint.split("://", 1)[0]
        connector = self._connectors.get(scheme)
        if connector is None:
            raise KVTransferError(
                f"no transport for {endpoint!r} (have {sorted(self._connectors)})"
            )
        hello = pb.KVHello(compatibility=self._compatibility, sender_id=_sender_id())
        future: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()
        self._connecting[endpoint] = future
        try:
            channel = await connector.connect(endpoint, hello, timeout)
        except BaseException as e:
            self.metrics.record_failure(type(e).__name__)
            error = _connect_error(endpoint, e)
            # The callers waiting on this connection get a KVTransferError too, even when
            # the caller that connects was cancelled: a raw OSError there once escaped a
            # transfer's abort and left the prompt's blocks held for good.
            shared = (
                PeerLostError(f"connecting to {endpoint} was cancelled")
                if isinstance(error, asyncio.CancelledError)
                else error
            )
            future.set_exception(shared)
            future.exception()  # mark retrieved
            if error is e:
                raise
            raise error from e
        finally:
            del self._connecting[endpoint]
        future.set_result(channel)
        self._channels[endpoint] = channel
        return channel


def _connect_error(endpoint: str, error: BaseException) -> BaseException:
    """What a failed connection to ``endpoint`` raises: transport errors as the
    ``KVTransferError`` they mean, anything else (a cancellation) as it is."""
    if isinstance(error, KVTransferError):
        return error
    if isinstance(error, TimeoutError):  # an OSError too: first
        return TransferTimeoutError(f"connecting to {endpoint} timed out")
    if isinstance(error, OSError):
        return PeerLostError(f"cannot connect to {endpoint}: {error}")
    return error


def _sender_id() -> int:
    # Names this connection's tag space on UCX (high 32 bits of every payload/ack tag).
    return int.from_bytes(os.urandom(4), "little") | 1
