"""A gRPC ``ChatPrompt`` as the chat template takes it, and tool calls in gRPC responses.

The chat's messages and tools are checked by the same pydantic models as
``/v1/chat/completions`` (``ChatMessage``, ``ChatTool``), so one chat is refused or rendered
the same over either API; a refusal names the proto's field (``chat.messages[1].role: ...``).
Tools work as on HTTP (router/openai_tools.py): "auto" parses the calls the model writes,
"required" and a named function force them with a grammar, and a response carries each call
once its block has closed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, struct_pb2
from pydantic import BaseModel, ValidationError

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredOutput
from protos.pdserve.v1 import generate_pb2 as pb
from router.errors import ErrorKind, RequestError, invalid_argument
from router.json_body import check_json_value, refuse_constant
from router.openai_format import finish_reason
from router.openai_protocol import ChatMessage
from router.openai_tools import (
    ChatTool,
    NamedToolChoice,
    ToolCallStream,
    ToolChoice,
    forced_names,
    template_tools,
    tool_grammar,
    tool_mode,
)
from router.request_limits import RequestLimits
from router.tokenizer_ops import ChatTemplateOptions

MODES = ("auto", "none", "required")


@dataclass(frozen=True)
class Chat:
    """What a ``ChatPrompt`` asks for: template input, and how tools are used."""

    messages: list[dict[str, Any]]
    options: ChatTemplateOptions
    tools: list[dict[str, Any]] | None  # as the template takes them; None: no tools
    grammar: StructuredOutput | None  # forced calls ("required" or a named function)
    forced: tuple[str, ...] = ()  # the tool names the grammar allows

    @property
    def parses_tools(self) -> bool:
        return self.tools is not None

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the grammar that forces this chat's calls, if it has one. Raises
        RequestError(INVALID) where they cannot take it."""
        if self.grammar is None:
            return params
        if params.structured is not None:
            raise RequestError(
                ErrorKind.INVALID,
                "chat.tool_choice: a forced tool call cannot be combined with "
                "sampling_params.structured",
                "chat",
            )
        try:  # e.g. ignore_eos, which a grammar that decides the end refuses
            return dataclasses.replace(params, structured=self.grammar)
        except ValueError as e:
            raise invalid_argument(e) from None


def chat_from_proto(chat: pb.ChatPrompt) -> Chat:
    """Raises RequestError(INVALID) naming the field."""
    try:
        if not chat.messages:
            raise ValueError("chat.messages: give at least one message")
        messages = [_message(m, f"chat.messages[{i}]") for i, m in enumerate(chat.messages)]
        tools = [_tool(t, f"chat.tools[{i}]") for i, t in enumerate(chat.tools)]
        choice = _choice(chat)
        if not tools and choice not in (None, "none"):
            raise ValueError("chat.tools: a tool_choice other than none needs tools")
        mode = tool_mode(tools, choice)
    except ValueError as e:
        raise RequestError(ErrorKind.INVALID, str(e), "chat") from None
    grammar = None
    if mode == "forced":
        assert choice is not None
        parallel = chat.parallel_tool_calls if chat.HasField("parallel_tool_calls") else True
        try:
            grammar = tool_grammar(tools, choice, parallel)
        except ValueError as e:  # a named function that is not among the tools
            raise RequestError(ErrorKind.INVALID, f"chat.{e}", "chat") from None
    kwargs: dict[str, Any] = {}
    if chat.HasField("chat_template_kwargs"):
        kwargs = struct_to_json(chat.chat_template_kwargs)
    add_prompt = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
    return Chat(
        messages=messages,
        options=ChatTemplateOptions(add_prompt, chat.continue_final_message, kwargs),
        tools=template_tools(tools) if mode != "none" else None,
        grammar=grammar,
        forced=forced_names(tools, choice),
    )


def struct_to_json(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as the JSON object it carries. A Struct holds every number as a double; a
    whole one comes back as an int, as JSON text would give it (a template may compare it to
    one, or use it as a count)."""

    def plain(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    out: dict[str, Any] = plain(json_format.MessageToDict(struct))
    return out


def _json_object(text: str, where: str) -> dict[str, Any]:
    """JSON text that must hold an object, checked as HTTP checks a body (finite numbers, depth,
    no lone surrogates). Raises ValueError naming ``where``."""
    try:
        obj = json.loads(text, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: must be a JSON object, got {type(obj).__name__}")
    try:
        check_json_value(obj, RequestLimits.max_json_depth)
    except RequestError as e:
        raise ValueError(f"{where}: {e.message}") from None
    return obj


def _validated(model: type[BaseModel], raw: dict[str, Any], where: str, drop: str = "") -> Any:
    """``model`` from ``raw``; a ValueError naming the field under ``where`` (``drop``: a
    nesting level of the pydantic model that the proto does not have)."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        loc = [str(p) if isinstance(p, str) else f"[{p}]" for p in first["loc"] if p != drop]
        if not loc:  # a whole-message rule: its message starts with the field it is about
            raise ValueError(f"{where}.{message}") from None
        path = "".join(p if p.startswith("[") else f".{p}" for p in loc)
        raise ValueError(f"{where}{path}: {message}") from None


def _message(m: pb.ChatMessage, where: str) -> dict[str, Any]:
    raw: dict[str, Any] = {"role": m.role}
    if m.HasField("content"):
        raw["content"] = m.content
    if m.name:
        raw["name"] = m.name
    if m.tool_calls:
        raw["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        raw["tool_call_id"] = m.tool_call_id
    message: ChatMessage = _validated(ChatMessage, raw, where)
    return message.as_template_input()


def _tool(t: pb.Tool, where: str) -> ChatTool:
    function: dict[str, Any] = {"name": t.name}
    if t.description:
        function["description"] = t.description
    if t.parameters:
        function["parameters"] = _json_object(t.parameters, f"{where}.parameters")
    tool: ChatTool = _validated(
        ChatTool, {"type": "function", "function": function}, where, drop="function"
    )
    return tool


def _choice(chat: pb.ChatPrompt) -> ToolChoice | None:
    kind = chat.WhichOneof("tool_choice")
    if kind == "tool_choice_function":
        return NamedToolChoice.model_validate(
            {"type": "function", "function": {"name": chat.tool_choice_function}}
        )
    if kind == "tool_choice_mode":
        mode = chat.tool_choice_mode
        if mode not in MODES:
            raise ValueError(
                f"chat.tool_choice_mode: must be one of {', '.join(MODES)} (or name a tool in "
                f"tool_choice_function); got {mode!r}"
            )
        return mode  # type: ignore[return-value]
    return None


@dataclass
class ToolCallsOut:
    """Moves the tool calls out of each sequence's text into ``GenerateResponse.tool_calls``
    as their blocks close, and reports finish reason "tool_calls" for a sequence that made
    calls (ToolCallStream, as HTTP streams them)."""

    forced: tuple[str, ...] = ()  # Chat.forced: a forced call cut short is still a call
    streams: dict[int, ToolCallStream] = field(default_factory=dict)
    called: set[int] = field(default_factory=set)

    def apply(self, index: int, out: RequestOutput, text: str, msg: pb.GenerateResponse) -> None:
        """``text``: the message's new text (the whole text for a whole sequence)."""
        stream = self.streams.setdefault(index, ToolCallStream(self.forced))
        content, calls = stream.feed(text, out.finished)
        msg.text = content
        for c in calls:
            msg.tool_calls.append(pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments))
        if calls:
            self.called.add(index)
        if out.finished:
            msg.finish_reason = finish_reason(out, index in self.called) or ""
