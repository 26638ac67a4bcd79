"""Why the router refuses a request, independent of the protocol that carries the answer.

gRPC and HTTP each map a ``RequestError`` to their own status (see ``grpc_server`` and
``openai_http``); the message always names what to fix.
"""

from __future__ import annotations

import enum
import re
from dataclasses import fields

from engine.sampling_params import SamplingParams

_FIELDS = {f.name for f in fields(SamplingParams)} | {
    "prompt",
    "prompt_token_ids",
    "messages",
    "model",
    "n",
    "priority",
    "timeout",
    "request_id",
    "echo",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "max_completion_tokens",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "tool_choice",
    "tools",
    "best_of",
    "logit_bias",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
}


class ErrorKind(enum.Enum):
    INVALID = "invalid_request_error"  # gRPC INVALID_ARGUMENT, HTTP 400
    TOO_LARGE = "request_too_large"  # HTTP 413 (body over the limit); gRPC has its own limit
    NOT_FOUND = "not_found_error"  # NOT_FOUND, 404 (unknown model)
    CONFLICT = "conflict_error"  # ALREADY_EXISTS, 409 (a request id already in flight)
    BUSY = "server_busy"  # RESOURCE_EXHAUSTED, 429
    TIMEOUT = "timeout"  # DEADLINE_EXCEEDED, 504
    UNAVAILABLE = "service_unavailable"  # UNAVAILABLE, 503
    INTERNAL = "internal_error"  # INTERNAL, 500


class RequestError(Exception):
    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s


def invalid_argument(e: ValueError, prompt_field: str = "prompt") -> RequestError:
    """Map an engine/SamplingParams ValueError (its message starts with the field name)."""
    message = str(e)
    m = re.match(r"[a-z_]+", message)
    param = m.group(0) if m and m.group(0) in _FIELDS else None
    if param in ("prompt", "prompt_token_ids"):
        param = prompt_field
    return RequestError(ErrorKind.INVALID, message, param)


def unknown_model(requested: str, served: str) -> RequestError:
    return RequestError(
        ErrorKind.NOT_FOUND,
        f"model: {requested!r} is not served here (this is {served!r})",
        "model",
    )
