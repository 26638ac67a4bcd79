"""A gRPC ``ChatPrompt`` as the chat template takes it: the same messages and options
``/v1/chat/completions`` hands to ``Prompts.chat``, checked field by field."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from protos.pdserve.v1 import generate_pb2 as pb
from router.errors import ErrorKind, RequestError
from router.tokenizer_ops import ChatTemplateOptions

ROLES = ("system", "user", "assistant", "developer")


def chat_from_proto(chat: pb.ChatPrompt) -> tuple[list[dict[str, Any]], ChatTemplateOptions]:
    """The chat's messages (template input) and template options. Raises
    RequestError(INVALID) naming the field (``chat.messages[1].role: ...``)."""
    try:
        return _messages(chat), _options(chat)
    except ValueError as e:
        raise RequestError(ErrorKind.INVALID, str(e), "chat") from None


def _messages(chat: pb.ChatPrompt) -> list[dict[str, Any]]:
    if not chat.messages:
        raise ValueError("chat.messages: give at least one message")
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(chat.messages):
        where = f"chat.messages[{i}]"
        if m.role == "tool":
            raise ValueError(
                f"{where}.role: tool results and tool calls are on /v1/chat/completions "
                "(its responses carry parsed calls); this API takes text turns"
            )
        if m.role not in ROLES:
            raise ValueError(f"{where}.role: must be one of {', '.join(ROLES)}; got {m.role!r}")
        if not m.HasField("content"):
            raise ValueError(f"{where}.content: a {m.role} message needs content")
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name:
            message["name"] = m.name
        messages.append(message)
    return messages


def _options(chat: pb.ChatPrompt) -> ChatTemplateOptions:
    kwargs: dict[str, Any] = {}
    if chat.HasField("chat_template_kwargs"):
        kwargs = json_format.MessageToDict(chat.chat_template_kwargs)
    return ChatTemplateOptions(
        add_generation_prompt=(
            chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        ),
        continue_final_message=chat.continue_final_message,
        kwargs=kwargs,
    )
