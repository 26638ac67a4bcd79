"""The transport interfaces, one per role.

The decode worker runs a ``KVReceiver`` (it owns the pool, the reservation table and a
listening endpoint). The prefill worker uses one ``KVSender`` (kv_transfer.sender), which opens
a ``Channel`` to each decode endpoint it pushes to, through the ``Connector`` registered for the
endpoint's scheme (``tcp://``, ``ucx://``, ``inproc://``). The three transports share the
messages, the checks and the semantics; only how bytes move differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from engine.block_hash import BlockHash
from kv_transfer.metrics import TransferMetrics
from kv_transfer.ticket import ReservationTicket
from protos.pdserve.v1 import kv_transfer_pb2 as pb


class KVReceiver(Protocol):
    """Decode side: reserves pool blocks for requests and receives their KV into them."""

    @property
    def endpoint(self) -> str:
        """Where senders connect (valid after ``start``)."""

    @property
    def metrics(self) -> TransferMetrics: ...

    async def start(self) -> None:
        """Start listening (and the lease reaper) on the running event loop."""

    def reserve(
        self,
        request_id: str,
        block_ids: Sequence[int],
        cached_blocks: Mapping[int, BlockHash] | None = None,
        lease_s: float | None = None,
    ) -> ReservationTicket:
        """Reserve already-allocated ``block_ids`` (the request's block table, in order);
        ``cached_blocks`` maps indices decode already holds to their hashes (never written).
        Thread-safe. The owner is told exactly once how the reservation ends."""

    def renew(self, request_id: str) -> bool:
        """Extend the lease; False when the reservation is gone. Thread-safe."""

    def abort(self, request_id: str) -> bool:
        """Release the reservation now (idempotent). Thread-safe."""

    def check_integrity(self) -> None:
        """Raise AssertionError unless the reservation table's invariants hold."""

    def num_reservations(self) -> int: ...

    async def close(self) -> None:
        """Stop listening, drop connections, release every reservation (reason CLOSED)."""


class Channel(Protocol):
    """One connection from a sender to a receiver, shared by all the sender's transfers to it."""

    @property
    def is_closed(self) -> bool: ...

    async def call(
        self, frame: pb.KVFrame, payload: Sequence[np.ndarray], timeout: float
    ) -> pb.KVFrame:
        """Send ``frame`` (its seq and, for UCX, payload tag are filled in here) followed by
        the raw ``payload`` spans, and return the peer's reply. Raises ``PeerLostError`` or
        ``TransferTimeoutError``; safe to call concurrently (frames never interleave)."""

    async def close(self) -> None: ...


class Connector(Protocol):
    """Opens channels for one endpoint scheme."""

    scheme: str

    async def connect(self, endpoint: str, hello: pb.KVHello, timeout: float) -> Channel:
        """Connect and handshake. Raises ``IncompatiblePeerError`` on a fingerprint mismatch."""
