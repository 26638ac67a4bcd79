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

from protos.pdserve.v1 import kv_transfer_pb2 as pb

HEADER_PREFIX = struct.Struct("<I")
MAX_HEADER_BYTES = 1 << 20


def encode_frame(frame: pb.KVFrame) -> bytes:
    """Length prefix + serialized header (raw payload bytes, if any, follow separately)."""
    header = frame.SerializeToString()
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    return HEADER_PREFIX.pack(len(header)) + header


def status_name(status: int) -> str:
    return pb.KVStatus.Name(status)  # type: ignore[arg-type]


def ack(status: int, error: str = "", num_missing_blocks: int = 0) -> pb.KVAck:
    return pb.KVAck(status=status, error=error, num_missing_blocks=num_missing_blocks)  # type: ignore[arg-type]
