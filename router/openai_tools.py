"""Tool calling on chat: the request types, the grammar that forces calls, and the one parser.

The tool-call format is the Hermes/Qwen2.5 one that their chat templates teach the model::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``tool_choice`` "required" or a named function is enforced by a grammar (structured outputs)
that allows only such blocks, each body valid against its tool's ``parameters`` schema;
"auto" parses whatever blocks the model wrote; "none" parses nothing. Streaming holds back
text that may open a block and emits each call as one delta once its block closes.

A forced call that ``max_tokens`` cuts still comes back as a call, not as text: its name and
its arguments' JSON as far as the model got, with finish reason "length" (as OpenAI and vLLM
return a cut call). A cut block under "auto" stays text: nothing forced the model to call.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.structured.spec import JSON_OPTIONS, StructuredOutput

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
# The start of a forced call's body as the grammar writes it (compact JSON, name first).
_CUT = re.compile(
    r'\{"name":"(?P<name>[^"\\]*)(?P<closed>")?(?:,"arguments":(?P<arguments>.*))?', re.DOTALL
)


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


def forced_names(tools: list[ChatTool] | None, choice: ToolChoice | None) -> tuple[str, ...]:
    """The names a forcing grammar allows: the named function's, every tool's for
    "required"; none where calls are not forced."""
    if tool_mode(tools, choice) != "forced":
        return ()
    assert tools is not None
    if isinstance(choice, NamedToolChoice):
        return (choice.function.name,)
    return tuple(t.function.name for t in tools)


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


def _cut_call(body: str, forced: Sequence[str]) -> ParsedCall | None:
    """The call a forced block cut short began (``body``: the text after ``<tool_call>``):
    its name, completed from ``forced`` where the cut fell inside it, and its arguments' JSON
    text as far as it got. None where the name is not yet told apart."""
    body = body.lstrip()
    body = body[: len(body) - _partial(body, CLOSE)].rstrip()
    whole = _parse_block(body)  # only the close tag was cut
    if whole is not None:
        return whole
    m = _CUT.match(body)
    prefix = m.group("name") if m else ""
    if m and m.group("closed"):
        names = [prefix] if prefix in forced else []
    else:
        names = [n for n in forced if n.startswith(prefix)]
    if len(names) != 1:
        return None
    arguments = (m.group("arguments") if m else None) or ""
    return ParsedCall(f"call_{uuid.uuid4().hex[:24]}", names[0], arguments)


def parse_tool_calls(text: str, forced: Sequence[str] = ()) -> tuple[str, list[ParsedCall]]:
    """Split finished output into its content (outside the blocks) and its tool calls. A
    block that does not parse stays in the content. ``forced``: the names a grammar forced
    (``forced_names``); then a last block cut short is a call, and never content."""
    if forced:  # the stream's rules for a cut block, fed the whole output at once
        whole, cut_calls = ToolCallStream(forced).feed(text, finished=True)
        return whole.strip(), cut_calls
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

    def __init__(self, forced: Sequence[str] = ()) -> None:
        self._buffer = ""  # held back: inside a block, or a possible start of one
        self._forced = tuple(forced)

    def feed(self, text: str, finished: bool) -> tuple[str, list[ParsedCall]]:
        self._buffer += text
        content: list[str] = []
        calls: list[ParsedCall] = []
        while True:
            start = self._buffer.find(OPEN)
            if start < 0:
                keep = _partial(self._buffer, OPEN)
                if finished and not self._forced:
                    keep = 0
                elif finished and keep:  # a forced call cut inside its open tag
                    call = _cut_call("", self._forced)
                    calls += [call] if call is not None else []
                cut = len(self._buffer) - keep
                content.append(self._buffer[:cut])
                self._buffer = "" if finished else self._buffer[cut:]
                break
            end = self._buffer.find(CLOSE, start)
            if end < 0:
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start:]
                if finished and self._forced:  # a forced call cut short is still a call
                    call = _cut_call(self._buffer[len(OPEN) :], self._forced)
                    calls += [call] if call is not None else []
                elif finished:  # an unterminated block is plain text
                    content.append(self._buffer)
                if finished:
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


def _partial(s: str, tag: str) -> int:
    """Length of the longest suffix of ``s`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(s)), 0, -1):
        if tag.startswith(s[-n:]):
            return n
    return 0
