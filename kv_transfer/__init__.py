"""Moving KV blocks from a prefill worker's pool into the blocks a decode worker reserved.

Decode side::

    receiver = create_receiver(spec, kv_pool, owner, transport="auto")
    await receiver.start()
    ticket = receiver.reserve(request_id, block_ids, cached_blocks)   # -> router -> prefill
    ...owner.on_transfer_complete(result) / owner.on_reservation_released(...)

Prefill side::

    sender = KVSender(spec, kv_pool)
    transfer = await sender.open(ticket)
    await transfer.push(block_indices, src_block_ids)      # per finished chunk
    await transfer.finish(first_token_id, first_token_logprob)

See docs/kv_transfer.md for the protocol and failure handling.
"""

from kv_transfer.compatibility import PROTOCOL_VERSION
from kv_transfer.errors import (
    IncompatiblePeerError,
    KVTransferError,
    PeerLostError,
    TransferIncompleteError,
    TransferRefusedError,
    TransferTimeoutError,
)
from kv_transfer.factory import (
    available_transports,
    create_receiver,
    is_ucx_available,
    release_transports,
    resolve_transport,
)
from kv_transfer.metrics import MetricsSnapshot, TransferMetrics
from kv_transfer.reservations import CompletedTransfer, ReleaseReason, ReservationOwner
from kv_transfer.sender import KVSender, OutgoingTransfer
from kv_transfer.ticket import ReservationTicket
from kv_transfer.transport import KVReceiver

__all__ = [
    "PROTOCOL_VERSION",
    "CompletedTransfer",
    "IncompatiblePeerError",
    "KVReceiver",
    "KVSender",
    "KVTransferError",
    "MetricsSnapshot",
    "OutgoingTransfer",
    "PeerLostError",
    "ReleaseReason",
    "ReservationOwner",
    "ReservationTicket",
    "TransferIncompleteError",
    "TransferMetrics",
    "TransferRefusedError",
    "TransferTimeoutError",
    "available_transports",
    "create_receiver",
    "is_ucx_available",
    "release_transports",
    "resolve_transport",
]
