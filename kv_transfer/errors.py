"""Exceptions raised by the KV transfer. Every one is a ``KVTransferError``."""

from __future__ import annotations


class KVTransferError(Exception):
    """Base class: the transfer of a request's KV blocks failed or was refused."""


class IncompatiblePeerError(KVTransferError):
    """The handshake found a different KV layout, model, dtype or protocol version."""


class TransferRefusedError(KVTransferError):
    """The decode side refused a write (unknown or released reservation, bad token, foreign
    block, malformed message). ``status`` is the ``KVStatus`` name it answered with."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}" if message else status)
        self.status = status


class TransferIncompleteError(KVTransferError):
    """The final message arrived but some expected blocks never did."""


class PeerLostError(KVTransferError):
    """The connection to the peer closed or failed while a transfer was using it."""


class TransferTimeoutError(KVTransferError, TimeoutError):
    """A wait ran past its deadline (the peer may be dead, stuck or partitioned)."""
