"""Decode side: the table of reservations (request id -> reserved blocks), with leases.

The block manager allocates blocks; this table only remembers which of them a request's
transfer may write, checks every write against it, and tells the owner exactly once per
reservation how it ended:

    reserve ──▶ ACTIVE ──(every expected block written, final message seen)──▶ complete
                  │                                              owner.on_transfer_complete
                  └──(abort, lease expiry, peer lost)──▶ RELEASING ──(no write in flight)──▶
                                                               owner.on_reservation_released

A reservation that is RELEASING or gone refuses every write, so bytes are never applied to
blocks the owner may already have reused. A write in flight when the reservation is released
delays the release callback until the write has stopped touching the blocks.

Thread-safe: the decode service may call ``reserve``/``renew``/``abort`` from any thread while a
transport's event loop calls the write methods. Owner callbacks run outside the lock, on the
thread whose call ended the reservation.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from engine.block_hash import BlockHash
from kv_transfer.reservation_types import (
    CompletedTransfer,
    PeerId,
    ReleaseReason,
    ReservationOwner,
    WriteGrant,
    WriteStatus,
)

__all__ = [
    "CompletedTransfer",
    "PeerId",
    "ReleaseReason",
    "ReservationOwner",
    "ReservationTable",
    "WriteGrant",
    "WriteStatus",
]

TOKEN_BYTES = 16


@dataclass
class _Reservation:
    request_id: str
    token: bytes
    block_ids: tuple[int, ...]
    cached: dict[int, BlockHash]
    expected: set[int]  # indices still to arrive
    lease_s: float
    deadline: float
    created: float
    peer: PeerId | None = None
    in_flight: int = 0
    writing: Counter[int] = field(default_factory=Counter)  # index -> writes in flight
    stalled: bool = False  # its write's peer was reported for cutting (once)
    release_reason: ReleaseReason | None = None  # set: RELEASING
    num_intact: int = 0  # set at release: leading blocks whose KV arrived whole
    final: tuple[int, float] | None = None  # (first token id, logprob) once the last message came
    num_received: int = 0
    num_bytes: int = 0
    index_of: dict[int, int] = field(default_factory=dict)  # block id -> index


class ReservationTable:
    """Live reservations of one decode worker's pool."""

    def __init__(
        self,
        num_blocks: int,
        owner: ReservationOwner,
        bytes_per_block: int,
        default_lease_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.num_blocks = num_blocks
        self.bytes_per_block = bytes_per_block
        self.default_lease_s = default_lease_s
        self._owner = owner
        self._clock = clock
        self._lock = threading.Lock()
        self._reservations: dict[str, _Reservation] = {}
        self._writable: dict[int, str] = {}  # block id -> request id, for blocks still expected

    # -- owner side -------------------------------------------------------------------------

    def reserve(
        self,
        request_id: str,
        block_ids: Sequence[int],
        cached_blocks: Mapping[int, BlockHash] | None = None,
        lease_s: float | None = None,
    ) -> tuple[bytes, float]:
        """Reserve ``block_ids`` (already allocated by the owner) for ``request_id``; the
        indices in ``cached_blocks`` already hold the right KV and are never written. Returns
        ``(token, lease_s)``. Raises ``ValueError`` for a live request id, an id outside the
        pool, a duplicate id, or a writable block that another reservation holds."""
        cached = dict(cached_blocks or {})
        lease = self.default_lease_s if lease_s is None else lease_s
        ids = tuple(int(b) for b in block_ids)
        if lease <= 0:
            raise ValueError(f"lease must be positive, got {lease}")
        if any(not 0 <= b < self.num_blocks for b in ids):
            raise ValueError(f"block ids outside the pool of {self.num_blocks}: {ids}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate block ids: {ids}")
        if any(not 0 <= i < len(ids) for i in cached):
            raise ValueError(f"cached block indices outside the request: {sorted(cached)}")
        expected = {i for i in range(len(ids)) if i not in cached}
        now = self._clock()
        token = secrets.token_bytes(TOKEN_BYTES)
        with self._lock:
            if request_id in self._reservations:
                raise ValueError(f"request {request_id} already has a reservation")
            taken = [ids[i] for i in expected if ids[i] in self._writable]
            if taken:
                raise ValueError(f"blocks {taken} are being written by another reservation")
            self._reservations[request_id] = _Reservation(
                request_id=request_id,
                token=token,
                block_ids=ids,
                cached=cached,
                expected=expected,
                lease_s=lease,
                deadline=now + lease,
                created=now,
                index_of={b: i for i, b in enumerate(ids)},
            )
            for i in expected:
                self._writable[ids[i]] = request_id
        return token, lease

    def renew(
        self, request_id: str, token: bytes | None = None, peer: PeerId | None = None
    ) -> bool:
        """Push the lease deadline to now + lease. ``token`` is checked when given (a remote
        renewal). Returns False for an unknown, released or wrongly-authenticated request."""
        with self._lock:
            r = self._live(request_id, token)
            if r is None:
                return False
            r.deadline = self._clock() + r.lease_s
            if peer is not None:
                r.peer = peer
            return True

    def abort(self, request_id: str, token: bytes | None = None) -> bool:
        """Release the reservation (idempotent: False when already gone)."""
        with self._lock:
            r = self._live(request_id, token)
            if r is None:
                return False
            done = self._start_release(r, ReleaseReason.ABORTED)
        self._notify(done)
        return True

    def expire(self) -> list[PeerId]:
        """Release every reservation whose lease has passed. Returns the peers with a write
        still in flight past its lease deadline into a released reservation (expired, or
        aborted while the write was on the wire): the transport must cut those connections so
        the writes stop (the release completes when they do). A write within its deadline is
        left to finish: cutting a connection releases every reservation it serves."""
        now = self._clock()
        stalled: list[PeerId] = []
        done: list[_Reservation] = []
        with self._lock:
            for r in list(self._reservations.values()):
                if r.release_reason is None and r.deadline <= now:
                    done += self._start_release(r, ReleaseReason.EXPIRED)
                if r.release_reason is not None and r.in_flight and r.deadline <= now:
                    if r.peer is not None and not r.stalled:
                        r.stalled = True
                        stalled.append(r.peer)
        self._notify(done)
        return stalled

    def peer_lost(self, peer: PeerId) -> int:
        """Release every live reservation last written or renewed by ``peer``; returns how many."""
        done: list[_Reservation] = []
        num_released = 0
        with self._lock:
            for r in list(self._reservations.values()):
                if r.peer == peer and r.release_reason is None:
                    done += self._start_release(r, ReleaseReason.PEER_LOST)
                    num_released += 1
        self._notify(done)
        return num_released

    def release_all(self, reason: ReleaseReason = ReleaseReason.CLOSED) -> None:
        done: list[_Reservation] = []
        with self._lock:
            for r in list(self._reservations.values()):
                if r.release_reason is None:
                    done += self._start_release(r, reason)
        self._notify(done)

    def next_deadline(self) -> float | None:
        """Earliest lease deadline (clock time) of a live reservation or of a released one with
        a write in flight, or None."""
        with self._lock:
            deadlines = [
                r.deadline
                for r in self._reservations.values()
                if r.release_reason is None or (r.in_flight and not r.stalled)
            ]
        return min(deadlines, default=None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._reservations)

    def __contains__(self, request_id: object) -> bool:
        with self._lock:
            return request_id in self._reservations

    # -- transport side ---------------------------------------------------------------------

    def begin_write(
        self,
        request_id: str,
        token: bytes,
        block_indices: Sequence[int],
        block_ids: Sequence[int],
        peer: PeerId,
        is_last: bool = False,
        first_token_id: int = 0,
        first_token_logprob: float = 0.0,
    ) -> WriteGrant | tuple[WriteStatus, str]:
        """Check a write and, when allowed, mark it in flight (the lease is renewed). Returns a
        grant, or ``(status, message)`` for a refused write. Every grant must be followed by
        exactly one ``end_write``."""
        with self._lock:
            r = self._reservations.get(request_id)
            if r is None or r.release_reason is not None:
                return WriteStatus.UNKNOWN_RESERVATION, f"no live reservation for {request_id!r}"
            if not hmac.compare_digest(r.token, token):
                return WriteStatus.BAD_TOKEN, f"wrong token for {request_id!r}"
            if len(block_indices) != len(block_ids):
                return WriteStatus.FOREIGN_BLOCK, "block_indices and block_ids differ in length"
            for index, block_id in zip(block_indices, block_ids, strict=True):
                if r.index_of.get(block_id) != index or index in r.cached:
                    return (
                        WriteStatus.FOREIGN_BLOCK,
                        f"block {block_id} at index {index} is not writable in {request_id!r}",
                    )
            if len(set(block_indices)) != len(block_indices):
                return WriteStatus.FOREIGN_BLOCK, "duplicate block index in one write"
            r.in_flight += 1
            r.writing.update(block_indices)
            r.peer = peer
            r.deadline = self._clock() + r.lease_s
            return WriteGrant(
                request_id=request_id,
                block_indices=tuple(block_indices),
                block_ids=tuple(block_ids),
                is_last=is_last,
                first_token_id=first_token_id,
                first_token_logprob=first_token_logprob,
                bytes_per_block=self.bytes_per_block,
            )

    def end_write(self, grant: WriteGrant, ok: bool) -> tuple[WriteStatus, int]:
        """The grant's bytes have landed (``ok``) or the write failed part way (its blocks are
        not counted as received). Returns ``(status, num_missing_blocks)``: OK, or INCOMPLETE
        when this was the final message and expected blocks are still missing, or
        UNKNOWN_RESERVATION when the reservation was released during the write."""
        done: list[_Reservation] = []
        complete: _Reservation | None = None
        with self._lock:
            r = self._reservations[grant.request_id]
            r.in_flight -= 1
            r.writing.subtract(grant.block_indices)
            if not ok and r.release_reason is None:
                for index in grant.block_indices:  # a torn rewrite of a block received before
                    if index not in r.expected:
                        r.expected.add(index)
                        self._writable[r.block_ids[index]] = r.request_id
                        r.num_received -= 1
                        r.num_bytes -= grant.bytes_per_block
            if r.release_reason is not None:
                if r.in_flight == 0:
                    done = self._finish_release(r)
                status, missing = WriteStatus.UNKNOWN_RESERVATION, len(r.expected)
            else:
                if ok:
                    for index in grant.block_indices:
                        if index in r.expected:
                            r.expected.discard(index)
                            del self._writable[r.block_ids[index]]
                            r.num_received += 1
                            r.num_bytes += grant.bytes_per_block
                    if grant.is_last:
                        r.final = (grant.first_token_id, grant.first_token_logprob)
                missing = len(r.expected)
                status = WriteStatus.OK
                if r.final is not None and not r.expected and r.in_flight == 0:
                    del self._reservations[r.request_id]
                    complete = r
                elif grant.is_last and ok and r.expected and r.in_flight == 0:
                    status = WriteStatus.INCOMPLETE
        self._notify(done)
        if complete is not None:
            assert complete.final is not None
            self._owner.on_transfer_complete(
                CompletedTransfer(
                    request_id=complete.request_id,
                    block_ids=complete.block_ids,
                    first_token_id=complete.final[0],
                    first_token_logprob=complete.final[1],
                    num_blocks_received=complete.num_received,
                    num_bytes_received=complete.num_bytes,
                    seconds=self._clock() - complete.created,
                )
            )
        return status, missing

    def check_integrity(self) -> None:
        """Raise AssertionError unless: every writable block belongs to exactly one live
        reservation that still expects it, and in-flight counts are non-negative."""
        with self._lock:
            writable: dict[int, str] = {}
            for r in self._reservations.values():
                assert r.in_flight >= 0, r
                if r.release_reason is not None:
                    continue
                for i in r.expected:
                    b = r.block_ids[i]
                    assert b not in writable, f"block {b} writable in two reservations"
                    writable[b] = r.request_id
            assert writable == self._writable, (writable, self._writable)

    # -- internals (lock held) --------------------------------------------------------------

    def _live(self, request_id: str, token: bytes | None) -> _Reservation | None:
        r = self._reservations.get(request_id)
        if r is None or r.release_reason is not None:
            return None
        if token is not None and not hmac.compare_digest(r.token, token):
            return None
        return r

    def _start_release(self, r: _Reservation, reason: ReleaseReason) -> list[_Reservation]:
        r.release_reason = reason
        # Blocks before the first one still expected or being written hold their KV whole
        # (written, or cached), and nothing can write them any more.
        writing = {i for i, n in r.writing.items() if n > 0}
        r.num_intact = min(r.expected | writing, default=len(r.block_ids))
        for i in r.expected:
            del self._writable[r.block_ids[i]]
        r.expected = set()
        if r.in_flight:
            return []  # the last end_write finishes the release
        return self._finish_release(r)

    def _finish_release(self, r: _Reservation) -> list[_Reservation]:
        del self._reservations[r.request_id]
        return [r]

    def _notify(self, released: list[_Reservation]) -> None:
        for r in released:
            assert r.release_reason is not None
            self._owner.on_reservation_released(
                r.request_id, r.block_ids, r.release_reason, r.num_intact
            )
