"""The tool-call parser (Hermes/Qwen2.5 format), whole and streamed, and the grammar that
forces calls: what the model writes becomes OpenAI's tool_calls, split at any point."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
from transformers import AutoTokenizer

from engine.demo_model import demo_model_path
from router.openai_tools import (
    ChatTool,
    NamedToolChoice,
    ToolCallStream,
    parse_tool_calls,
    tool_grammar,
)

TEXT = (
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
    '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call> done'
)


def test_whole_output_is_split_into_content_and_calls() -> None:
    content, calls = parse_tool_calls(TEXT)
    assert content == "Let me check. \n done".strip()
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Oslo"}
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    # A block that is not a call stays text; no blocks: the text is untouched.
    bad = "a <tool_call>not json</tool_call> b"
    assert parse_tool_calls(bad) == (bad, [])
    assert parse_tool_calls("  plain  ") == ("  plain  ", [])


def test_streamed_at_every_split_point_gives_the_same_calls() -> None:
    for cut in range(1, len(TEXT)):
        for pieces in ([TEXT[:cut], TEXT[cut:]], list(TEXT)):
            stream = ToolCallStream()
            content, names = "", []
            for i, piece in enumerate(pieces):
                text, calls = stream.feed(piece, finished=i == len(pieces) - 1)
                content += text
                names += [c.name for c in calls]
                assert "<tool_call" not in text  # a block is never streamed as text
            assert names == ["get_weather", "get_time"]
            assert content.replace(" ", "").replace("\n", "") == "Letmecheck.done"
    # Text that only looks like the start of a block comes out at the end.
    stream = ToolCallStream()
    assert stream.feed("x <tool_", finished=False) == ("x ", [])
    assert stream.feed("ca", finished=True) == ("<tool_ca", [])


def test_forcing_grammar_accepts_exactly_the_calls() -> None:
    tools = [
        ChatTool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}),
        ChatTool.model_validate({"type": "function", "function": {"name": "g"}}),
    ]  # fmt: skip
    spec = tool_grammar(tools, "required")
    spec.validate()
    hf: Any = AutoTokenizer.from_pretrained(str(demo_model_path()))
    tok = llguidance.hf.from_tokenizer(hf)

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(tok, spec.to_grammar())
        return all(m.consume_token(t) for t in hf.encode(text, add_special_tokens=False)) and (
            m.is_accepting()
        )

    one = '<tool_call>\n{"name":"f","arguments":{"x":3}}\n</tool_call>'
    assert accepts(one) and accepts(one + "\n" + one.replace('"f","arguments":{"x":3}',
                                                            '"g","arguments":{}'))  # fmt: skip
    assert not accepts('<tool_call>\n{"name":"h","arguments":{}}\n</tool_call>')
    # Compact JSON only, as for response formats: no blanks for a model to pad a call with.
    assert not accepts('<tool_call>\n{"name" :\r "f","arguments":{"x":3}}\n</tool_call>')
    assert not accepts('<tool_call>\n{"name":"f","arguments":{"x":3} \t}\n</tool_call>')
    assert not accepts("plain text")
    named = tool_grammar(tools, NamedToolChoice.model_validate(
        {"type": "function", "function": {"name": "g"}}))  # fmt: skip
    assert '"const": "g"' in named.value and '"const": "f"' not in named.value
    assert "call)*" not in named.value  # exactly one call


FORCED = (
    '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","unit":"c"}}\n</tool_call>\n'
    '<tool_call>\n{"name":"get_time","arguments":{"zone":"utc"}}\n</tool_call>'
)
WHOLE = [("get_weather", '{"city":"Oslo","unit":"c"}'), ("get_time", '{"zone":"utc"}')]


def test_a_forced_call_cut_short_is_still_a_call() -> None:
    """Forced output cut anywhere (max_tokens): the calls it holds come back as calls, the
    last one with its arguments' JSON as far as it got, never as text; whole and streamed
    give the same. Only a name cut before it tells the tools apart gives no call."""
    names = ("get_weather", "get_time")
    for end in range(len(FORCED) + 1):
        text = FORCED[:end]
        content, calls = parse_tool_calls(text, names)
        assert content == ""
        got = [(c.name, c.arguments) for c in calls]
        # a block is a call once its name is past the tools' common prefix "get_"
        told = len('<tool_call>\n{"name":"get_')
        assert len(got) == sum(end - b > told for b in (0, FORCED.index("<tool_call>", 1)))
        for (name, arguments), (whole_name, whole_arguments) in zip(got, WHOLE, strict=False):
            assert name == whole_name
            # a whole call is re-serialised (json.dumps); a cut one is the model's text
            assert whole_arguments.startswith(arguments) or json.loads(arguments) == json.loads(
                whole_arguments
            )
        for cut in {1, end // 2, max(end - 1, 0)}:
            stream = ToolCallStream(names)
            head, first = stream.feed(text[:cut], finished=False)
            tail, rest = stream.feed(text[cut:], finished=True)
            assert (head + tail).strip() == ""
            assert [(c.name, c.arguments) for c in first + rest] == [
                (c.name, c.arguments) for c in calls
            ]
    # One forced name: a cut anywhere in the block is that tool's call.
    for end in range(1, FORCED.index("</tool_call>")):
        _, calls = parse_tool_calls(FORCED[:end], ("get_weather",))
        assert [c.name for c in calls] == ["get_weather"]
    # Not forced ("auto"): a cut block is what the model wrote, as text.
    assert parse_tool_calls(FORCED[:40]) == (FORCED[:40], [])
