"""The bounds every request is held to before any expensive work, derived from the model.

A prompt of ``max_model_len`` tokens can never be longer than ``max_model_len`` times the
longest token's text, so a longer text is refused by its length alone, before tokenization;
the body-size limit follows from that bound (JSON escaping writes at most 6 bytes per
character) plus room for the rest of a request (tools, schemas, messages).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
_JSON_BYTES_PER_CHAR = 6  # "\\u1234"
_TOKEN_ID_BYTES = 8  # "1234567," in a JSON list of token ids


@dataclass(frozen=True)
class RequestLimits:
    """``max_prompt_chars``: longest text prompt (or all chat contents together) worth
    tokenizing; ``max_body_bytes``: largest HTTP body read (413 beyond it)."""

    max_prompt_chars: int
    max_body_bytes: int
    max_json_depth: int = 64
    max_stop_strings: int = 16
    max_stop_chars: int = 256
    max_stop_token_ids: int = 256
    max_logit_bias: int = 1024
    max_n: int = 128
    max_batch_prompts: int = 256

    @classmethod
    def for_model(cls, max_model_len: int, max_token_chars: int) -> RequestLimits:
        """Limits for a model whose longest token decodes to ``max_token_chars`` characters."""
        max_chars = max_model_len * max(1, max_token_chars)
        body = (
            max(_JSON_BYTES_PER_CHAR * max_chars, _TOKEN_ID_BYTES * max_model_len) + 4 * MIB
        )  # the other fields: messages' envelopes, tools, JSON schemas
        return cls(max_prompt_chars=max_chars, max_body_bytes=body)
