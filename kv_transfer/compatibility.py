"""The handshake's compatibility fingerprint: what two workers must share to exchange blocks."""

from __future__ import annotations

from engine.kv_cache_spec import KV_LAYOUT, KVCacheSpec
from protos.pdserve.v1 import kv_transfer_pb2 as pb

# Bump on any change to the messages' meaning or the raw payload layout.
PROTOCOL_VERSION = 1

_FIELDS = (
    "protocol_version",
    "model_id",
    "dtype",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "block_size",
    "kv_layout",
    "spec_fingerprint",
)


def compatibility_of(spec: KVCacheSpec) -> pb.KVCompatibility:
    """This worker's side of the handshake."""
    return pb.KVCompatibility(
        protocol_version=PROTOCOL_VERSION,
        spec_fingerprint=spec.fingerprint(),
        model_id=spec.model_id,
        dtype=spec.dtype,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        block_size=spec.block_size,
        kv_layout=KV_LAYOUT,
    )


def incompatibility(local: pb.KVCompatibility, remote: pb.KVCompatibility) -> str | None:
    """``None`` when the two sides can exchange blocks, else a message naming every field
    that differs (``local`` first), e.g. ``"dtype: 'float32' != 'bfloat16'"``."""
    diffs = [
        f"{name}: {getattr(local, name)!r} != {getattr(remote, name)!r}"
        for name in _FIELDS
        if getattr(local, name) != getattr(remote, name)
    ]
    if not diffs:
        return None
    return "incompatible KV cache (local != remote): " + "; ".join(diffs)
