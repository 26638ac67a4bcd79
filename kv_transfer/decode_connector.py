"""The decode worker's KV connector: an importing request's blocks become a reservation in the
KV receiver the moment the scheduler allocates them, and the receiver's callbacks say when the
prompt's KV has arrived (or why it never will).

    engine thread                          transport threads (receiver callbacks)
    ─────────────                          ──────────────────────────────────────
    scheduler admits an import request
      update_state_after_alloc ─▶ receiver.reserve ─▶ ticket ─▶ the service (expect_ticket)
                                           on_transfer_complete ─▶ loaded (first token)
                                           on_reservation_released ─▶ failed (with the
                                             intact prefix it keeps cached), or freeable
    get_finished() ◀─────────────── wake() ┘
    request_finished (abort while waiting) ─▶ receiver.abort; blocks freed once released

A released reservation refuses every write, and the receiver reports the release only once no
write is in flight, so blocks are freed (or reused) only when nothing can touch them.

A transfer that fails part way (the prefill worker died, stalled or gave up) leaves its
leading blocks whole: the scheduler publishes them in the prefix cache as it fails the request,
so the migrated retry, when it lands here again, reserves them as a local prefix hit and the
new prefill worker sends only the rest (it still computes the whole prompt: it has no KV).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

from engine.block_hash import BlockHash
from engine.kv_connector.base import KVConnectorOutput, KVLoaded, KVSave
from engine.request import Request
from kv_transfer.reservations import CompletedTransfer, ReleaseReason
from kv_transfer.ticket import ReservationTicket
from kv_transfer.transport import KVReceiver

_WHY = {
    ReleaseReason.EXPIRED: "the prefill worker neither sent KV nor renewed the lease in time",
    ReleaseReason.PEER_LOST: "the connection to the prefill worker was lost",
    ReleaseReason.ABORTED: "the prefill worker aborted it",
    ReleaseReason.CLOSED: "the decode worker is shutting down",
}

_TicketWaiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[ReservationTicket]"]


class DecodeConnector:
    """``engine.kv_connector.base.KVConnector`` for a decode worker; also the receiver's
    ``ReservationOwner``. Thread-safe where the protocols say so."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.receiver: KVReceiver | None = None  # set once the receiver is started
        self._lock = threading.Lock()
        self._wake: Callable[[], None] = lambda: None
        self._reserved: set[str] = set()  # reservations live (KV still arriving)
        self._aborting: set[str] = set()  # finished by the scheduler, release pending
        self._done: set[str] = set()  # imported already (a recompute later is local)
        self._loaded: dict[str, KVLoaded] = {}
        self._failed: dict[str, str] = {}
        self._intact: dict[str, int] = {}  # failed import -> prompt tokens whose KV arrived
        self._freeable: set[str] = set()
        self._tickets: dict[str, _TicketWaiter] = {}

    def attach(self, receiver: KVReceiver) -> None:
        self.receiver = receiver

    # ------------------------------------------------------------------ the service's side
    def expect_ticket(self, request_id: str) -> asyncio.Future[ReservationTicket]:
        """A future for the reservation ticket of ``request_id`` (call before adding the
        request to the engine; the future fails if the reservation cannot be made)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ReservationTicket] = loop.create_future()
        with self._lock:
            self._tickets[request_id] = (loop, future)
        return future

    def forget(self, request_id: str) -> None:
        """The service stopped serving ``request_id`` (its stream is over)."""
        with self._lock:
            self._tickets.pop(request_id, None)
            self._done.discard(request_id)

    # ------------------------------------------------------------------ scheduler side
    def set_wakeup(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if not request.is_import:
            return 0, False
        with self._lock:
            if request.request_id in self._done:
                return 0, False  # preempted (recompute) after its import: compute it here
        return request.num_prompt_tokens - num_computed_tokens, True

    def update_state_after_alloc(
        self, request: Request, block_ids: Sequence[int], num_external_tokens: int
    ) -> None:
        assert self.receiver is not None, "the receiver is not attached"
        rid = request.request_id
        # The local prefix hit is whole blocks: they are skipped by the sender.
        num_local_blocks = (request.num_prompt_tokens - num_external_tokens) // self.block_size
        cached: dict[int, BlockHash] = {i: request.block_hashes[i] for i in range(num_local_blocks)}
        try:
            ticket = self.receiver.reserve(rid, block_ids, cached)
        except (ValueError, RuntimeError) as e:
            with self._lock:
                self._failed[rid] = f"cannot reserve KV blocks: {e}"
            self._settle_ticket(rid, None, e)
            self._wake()
            return
        with self._lock:
            self._reserved.add(rid)
        self._settle_ticket(rid, ticket, None)

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> bool:
        rid = request.request_id
        with self._lock:
            live = rid in self._reserved
            if live:
                self._aborting.add(rid)
        if live:
            assert self.receiver is not None
            # Released at once, or when the write in flight ends: then freeable.
            self.receiver.abort(rid)
            return True
        return False

    def save_kv(self, saves: Sequence[KVSave]) -> None:
        if saves:
            raise RuntimeError("a decode worker exports no KV")

    def get_finished(self) -> KVConnectorOutput:
        with self._lock:
            out = KVConnectorOutput(
                loaded=self._loaded,
                failed=self._failed,
                freeable=frozenset(self._freeable),
                intact=self._intact,
            )
            self._loaded, self._failed, self._freeable, self._intact = {}, {}, set(), {}
        return out

    def has_pending_output(self) -> bool:
        with self._lock:
            return bool(self._loaded or self._failed or self._freeable)

    # ------------------------------------------------------------------ ReservationOwner
    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        rid = result.request_id
        with self._lock:
            self._reserved.discard(rid)
            if rid in self._aborting:  # aborted as the last block landed: just free
                self._aborting.discard(rid)
                self._freeable.add(rid)
            else:
                self._done.add(rid)
                self._loaded[rid] = KVLoaded(result.first_token_id, result.first_token_logprob)
        self._wake()

    def on_reservation_released(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        reason: ReleaseReason,
        num_intact_blocks: int,
    ) -> None:
        with self._lock:
            self._reserved.discard(request_id)
            if request_id in self._aborting:
                self._aborting.discard(request_id)
                self._freeable.add(request_id)
            else:
                self._failed[request_id] = (
                    f"KV transfer for {request_id} ended before completion: {reason.value} "
                    f"({_WHY[reason]})"
                )
                if num_intact_blocks:
                    self._intact[request_id] = num_intact_blocks * self.block_size
        self._wake()

    # ------------------------------------------------------------------ private
    def _settle_ticket(
        self, request_id: str, ticket: ReservationTicket | None, error: Exception | None
    ) -> None:
        with self._lock:
            entry = self._tickets.get(request_id)
        if entry is None:
            return
        loop, future = entry

        def settle() -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(ticket)  # type: ignore[arg-type]

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass  # the service's loop is gone
