"""Tool calling on chat: the request types, the grammar that forces calls, and the one parser.

The tool-call format is the Hermes/Qwen2.5 one that their chat templates teach the model::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``tool_choice`` "required" or a named function is enforced by a grammar (structured outputs)
that allows only such blocks, each body valid against its tool's ``parameters`` schema;
"auto" parses whatever blocks the model wrote; "none" parses nothing. Streaming holds back
text that may open a block and emits each call as one delta once its block closes.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.structured.spec import JSON_OPTIONS, StructuredOutput

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"]
    function: CalledFunction

    def as_template_input(self) -> dict[str, Any]:
        try:
            arguments: Any = json.loads(self.function.arguments)
        except json.JSONDecodeError:
            arguments = self.function.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": arguments},
        }


def template_tools(tools: list[ChatTool] | None) -> list[dict[str, Any]] | None:
    """The tools as the chat template takes them (``tools``; None when there are none)."""
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None


def tool_mode(
    tools: list[ChatTool] | None, choice: ToolChoice | None
) -> Literal["none", "auto", "forced"]:
    """How tools are used: not at all, parsed from free output, or forced by a grammar."""
    if not tools:
        if choice not in (None, "none"):
            raise ValueError("tool_choice: needs tools")
        return "none"
    if choice is None or choice == "auto":
        return "auto"
    if choice == "none":
        return "none"
    return "forced"


def tool_grammar(
    tools: list[ChatTool], choice: ToolChoice, parallel: bool = True
) -> StructuredOutput:
    """A grammar allowing only tool-call blocks: one or more (``parallel``) for "required",
    exactly the named function's for a named choice."""
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            raise ValueError(f"tool_choice: no tool named {choice.function.name!r}")
        parallel = False
    else:
        chosen = tools
    bodies = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": t.function.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in chosen
    ]
    schema = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
    # Compact JSON, as response formats get: with llguidance's default (whitespace allowed
    # between any tokens) a model could fill max_tokens with blanks inside a call.
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    repeat = ' ("\\n" call)*' if parallel else ""
    lark = (
        f"start: call{repeat}\n"
        f'call: "{OPEN}\\n" body "\\n{CLOSE}"\n'
        f"body: %json {json.dumps(schema)}\n"
    )
    return StructuredOutput("grammar", lark, "tool_choice")


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text

    def as_message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _parse_block(body: str) -> ParsedCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return ParsedCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], json.dumps(args))


def parse_tool_calls(text: str) -> tuple[str, list[ParsedCall]]:
    """Split finished output into its content (outside the blocks) and its tool calls. A
    block that does not parse stays in the content."""
    calls: list[ParsedCall] = []
    content: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _parse_block(m.group(1))
        if call is None:
            continue
        content.append(text[pos : m.start()])
        calls.append(call)
        pos = m.end()
    content.append(text[pos:])
    return "".join(content).strip() if calls else text, calls


class ToolCallStream:
    """Incremental ``parse_tool_calls``: feed text deltas, get content deltas and calls."""

    def __init__(self) -> None:
        self._buffer = ""  # held back: inside a block, or a possible start of one

    def feed(self, text: str, finished: bool) -> tuple[str, list[ParsedCall]]:
        self._buffer += text
        content: list[str] = []
        calls: list[ParsedCall] = []
        while True:
            start = self._buffer.find(OPEN)
            if start < 0:
                keep = 0 if finished else _partial_open(self._buffer)
                cut = len(self._buffer) - keep
                content.append(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
                break
            end = self._buffer.find(CLOSE, start)
            if end < 0:
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start:]
                if finished:  # an unterminated block is plain text
                    content.append(self._buffer)
                    self._buffer = ""
                break
            call = _parse_block(self._buffer[start + len(OPEN) : end].strip())
            if call is None:
                content.append(self._buffer[: end + len(CLOSE)])
            else:
                content.append(self._buffer[:start])
                calls.append(call)
            self._buffer = self._buffer[end + len(CLOSE) :]
        text_out = "".join(content)
        if calls and not text_out.strip():
            text_out = ""
        return text_out, calls


def _partial_open(s: str) -> int:
    """Length of the longest suffix of ``s`` that is a proper prefix of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(s)), 0, -1):
        if OPEN.startswith(s[-n:]):
            return n
    return 0
