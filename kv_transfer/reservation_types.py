"""The plain data a decode worker's reservation table speaks in: why a reservation ended, a
completed transfer, the owner's callbacks, and a write's status and grant."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

PeerId = Hashable  # a transport's name for one connection


class ReleaseReason(enum.Enum):
    ABORTED = "aborted"
    EXPIRED = "expired"
    PEER_LOST = "peer_lost"
    CLOSED = "closed"  # the receiver shut down


@dataclass(frozen=True)
class CompletedTransfer:
    """Every expected block of ``request_id`` arrived; the blocks now belong to the owner."""

    request_id: str
    block_ids: tuple[int, ...]
    first_token_id: int
    first_token_logprob: float
    num_blocks_received: int
    num_bytes_received: int
    seconds: float  # from the reservation to completion


class ReservationOwner(Protocol):
    """Whoever allocated the blocks (the decode service's block manager). Exactly one of the
    two methods is called once per reservation; they must be quick and must not raise."""

    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        """Admit the request: its blocks hold the prompt's KV and the first token is known."""

    def on_reservation_released(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        reason: ReleaseReason,
        num_intact_blocks: int,
    ) -> None:
        """Free ``block_ids``: no transfer will touch them again. The first
        ``num_intact_blocks`` of them hold their KV whole (written, or cached before): the
        owner may keep them as cached prefix, so a retry sends only the rest."""


class WriteStatus(enum.Enum):
    OK = "KV_STATUS_OK"
    UNKNOWN_RESERVATION = "KV_STATUS_UNKNOWN_RESERVATION"
    BAD_TOKEN = "KV_STATUS_BAD_TOKEN"
    FOREIGN_BLOCK = "KV_STATUS_FOREIGN_BLOCK"
    INCOMPLETE = "KV_STATUS_INCOMPLETE"


@dataclass(frozen=True)
class WriteGrant:
    """Permission to write ``block_ids`` of a live reservation; hand it back to ``end_write``."""

    request_id: str
    block_indices: tuple[int, ...]
    block_ids: tuple[int, ...]
    is_last: bool
    first_token_id: int
    first_token_logprob: float
    bytes_per_block: int
