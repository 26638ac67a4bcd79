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


class PeerNotTrustedError(KVTransferError):
    """The TLS handshake with the decode side failed: its certificate is not signed by the
    release's CA, has expired or does not carry the expected name (or it refused ours)."""


class PeerNotAllowedError(KVTransferError):
    """A ticket points at an endpoint this prefill worker does not push KV to (not among
    its known decode workers, ``--kv-allowed-peers``): refused before any connection."""
