"""Chained, seeded hashes of full KV blocks: the prefix-cache key every process agrees on.

    hash(block i) = sha256(hash(block i-1) || token ids of block i || extra keys)[:16]

with ``hash(block -1) = ROOT_BLOCK_HASH``, a fixed seed. Two requests whose first ``n`` full
blocks hold the same tokens (and the same extra keys, e.g. a LoRA or multimodal id) get the same
``n`` hashes, in this process, in another worker, or in the router's prefix index. Only full blocks
are hashed; a partial last block has no hash and is never shared.

The exact bytes are pinned by a golden test: changing them invalidates every cache in a cluster.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import NewType

BlockHash = NewType("BlockHash", bytes)

HASH_BYTES = 16
ROOT_BLOCK_HASH = BlockHash(hashlib.sha256(b"pdserve-prefix-cache-v1").digest()[:HASH_BYTES])


def hash_block(
    parent: BlockHash, token_ids: Sequence[int], extra_keys: Sequence[str] = ()
) -> BlockHash:
    """Hash one full block given its parent's hash. Token ids are encoded as little-endian u32."""
    h = hashlib.sha256(parent)
    h.update(len(token_ids).to_bytes(4, "little"))
    encoded = array("I", token_ids)
    if sys.byteorder != "little":
        encoded.byteswap()
    h.update(encoded.tobytes())
    for key in extra_keys:
        h.update(b"\x00" + key.encode())
    return BlockHash(h.digest()[:HASH_BYTES])


def hash_block_tokens(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[str] = (),
    parent: BlockHash = ROOT_BLOCK_HASH,
) -> list[BlockHash]:
    """Hashes of every *full* block of ``token_ids`` (a trailing partial block is skipped)."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], extra_keys)
        hashes.append(parent)
    return hashes
