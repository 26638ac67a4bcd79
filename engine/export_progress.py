"""What a step completed of an exported request's prompt: the ``KVSave`` the scheduler lists
for the KV connector (the blocks that became full, and the last one with the first token)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.kv_connector.base import KVSave
from engine.request import Request


def next_save(
    request: Request, table: Sequence[int], block_size: int, token: int | None
) -> KVSave | None:
    """The prompt blocks past ``request.num_exported_blocks`` that are now complete (all of
    them once the prompt is done), marked exported; None when there are none yet."""
    num_blocks = -(-request.num_prompt_tokens // block_size)
    prompt_done = request.num_computed_tokens >= request.num_prompt_tokens
    complete = num_blocks if prompt_done else request.num_computed_tokens // block_size
    start = request.num_exported_blocks
    if complete <= start and not prompt_done:
        return None
    request.num_exported_blocks = complete
    return KVSave(
        request_id=request.request_id,
        block_indices=tuple(range(start, complete)),
        block_ids=tuple(table[start:complete]),
        is_last=prompt_done and token is not None,
        first_token_id=token if prompt_done else None,
    )
