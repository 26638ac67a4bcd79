"""Framing shared by the transports: a protobuf ``KVFrame`` header, then raw block bytes.

On a byte stream (TCP) each frame is::

    ┌──────────────┬──────────────────────────┬──────────────────────────────────────────┐
    │ u32 LE: n    │ n bytes: KVFrame (proto) │ push.payload_bytes raw bytes (push only) │
    └──────────────┴──────────────────────────┴──────────────────────────────────────────┘

The raw bytes are the pushed blocks in the order of ``push.block_ids``, ``bytes_per_block``
each: exactly the pool's own bytes, so a receiver reads them straight into its pool.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from protos.pdserve.v1 import kv_transfer_pb2 as pb

HEADER_PREFIX = struct.Struct("<I")
MAX_HEADER_BYTES = 1 << 20


def encode_frame(frame: pb.KVFrame) -> bytes:
    """Length prefix + serialized header (raw payload bytes, if any, follow separately)."""
    header = frame.SerializeToString()
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    return HEADER_PREFIX.pack(len(header)) + header


def segment_runs(src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> list[int]:
    """Split a push into runs of blocks that are consecutive in *both* pools; returns the run
    lengths. Each run is one contiguous span on either side (one message on UCX).

        src  7 8 9 3 4      dst  20 21 5 6 7   ->  [2, 1, 2]
    """
    runs: list[int] = []
    for k in range(len(src_block_ids)):
        if (
            k > 0
            and src_block_ids[k] == src_block_ids[k - 1] + 1
            and dst_block_ids[k] == dst_block_ids[k - 1] + 1
        ):
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def status_name(status: int) -> str:
    return pb.KVStatus.Name(status)  # type: ignore[arg-type]


def ack(status: int, error: str = "", num_missing_blocks: int = 0) -> pb.KVAck:
    return pb.KVAck(status=status, error=error, num_missing_blocks=num_missing_blocks)  # type: ignore[arg-type]
