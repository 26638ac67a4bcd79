"""The reservation ticket: what decode hands (through the router) to prefill for one request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.block_hash import BlockHash
from kv_transfer.errors import KVTransferError
from protos.pdserve.v1 import kv_transfer_pb2 as pb


@dataclass(frozen=True)
class ReservationTicket:
    """Decode's reservation of pool blocks for one request.

    ``block_ids[i]`` is the decode pool block that receives block ``i`` of the request (block
    ``i`` holds tokens ``[i * block_size, (i + 1) * block_size)``). ``cached_blocks`` maps the
    indices decode already holds (prefix-cache hits) to their hashes: prefill must not send them,
    and decode refuses writes to them.
    """

    request_id: str
    endpoint: str
    token: bytes
    block_ids: tuple[int, ...]
    cached_blocks: Mapping[int, BlockHash] = field(default_factory=dict)
    lease_s: float = 30.0
    compatibility: pb.KVCompatibility | None = None

    @property
    def expected_block_indices(self) -> list[int]:
        """Indices decode waits for: every block of the request except the cached ones."""
        return [i for i in range(len(self.block_ids)) if i not in self.cached_blocks]

    def blocks_to_send(self, block_hashes: Sequence[BlockHash | None]) -> list[int]:
        """Indices prefill must push, given prefill's own hashes of the request's blocks
        (``None`` for a partial block). A block is skipped only when decode holds the same
        hash at the same index; a different hash there means the two sides disagree about the
        prompt, which is an error (decode would refuse the write anyway)."""
        for index, cached_hash in self.cached_blocks.items():
            mine = block_hashes[index] if index < len(block_hashes) else None
            if mine != cached_hash:
                raise KVTransferError(
                    f"request {self.request_id}: decode holds block {index} with hash "
                    f"{cached_hash.hex()}, prefill computed {mine.hex() if mine else None}"
                )
        return self.expected_block_indices

    def to_proto(self) -> pb.KVReservation:
        message = pb.KVReservation(
            request_id=self.request_id,
            endpoint=self.endpoint,
            token=self.token,
            block_ids=self.block_ids,
            cached_blocks=[
                pb.CachedBlock(block_index=i, block_hash=h)
                for i, h in sorted(self.cached_blocks.items())
            ],
            lease_s=self.lease_s,
        )
        if self.compatibility is not None:
            message.compatibility.CopyFrom(self.compatibility)
        return message

    @classmethod
    def from_proto(cls, message: pb.KVReservation) -> ReservationTicket:
        return cls(
            request_id=message.request_id,
            endpoint=message.endpoint,
            token=message.token,
            block_ids=tuple(message.block_ids),
            cached_blocks={c.block_index: BlockHash(c.block_hash) for c in message.cached_blocks},
            lease_s=message.lease_s,
            compatibility=message.compatibility if message.HasField("compatibility") else None,
        )
