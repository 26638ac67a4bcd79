"""Turning a request's prompt into checked token ids: every limit a prompt must respect.

Each error is a ValueError whose message starts with the offending field, so the services can
answer INVALID_ARGUMENT / HTTP 400 naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def resolve_prompt_ids(
    prompt: str | None,
    prompt_token_ids: Sequence[int] | None,
    tokenize: Callable[[str], list[int]],
    vocab_size: int,
    max_model_len: int,
    kv_capacity_tokens: int,
) -> list[int]:
    """The prompt's token ids (``prompt_token_ids`` wins over ``prompt``), checked against the
    vocabulary, ``max_model_len`` (room for one output token) and the KV cache's capacity."""
    if prompt_token_ids is None:
        if prompt is None:
            raise ValueError("prompt: give a prompt or prompt_token_ids")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if not prompt:
            raise ValueError("prompt must not be empty")
        ids = tokenize(prompt)
    else:
        ids = list(prompt_token_ids)
    if not ids:
        raise ValueError("prompt must not be empty")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"prompt_token_ids must be integers in [0, {vocab_size}), got {t!r}")
    if len(ids) >= max_model_len:
        raise ValueError(
            f"prompt is {len(ids)} tokens; it must be shorter than max_model_len "
            f"({max_model_len}) to leave room for output"
        )
    if len(ids) >= kv_capacity_tokens:
        raise ValueError(
            f"prompt is {len(ids)} tokens; the KV cache holds at most {kv_capacity_tokens - 1}"
        )
    return ids
