"""Chat prompts over gRPC (``GenerateRequest.chat``, ``TokenizeRequest.chat``) on a real
server, every mode: a chat renders as the tokenizer's ``apply_chat_template`` renders it with
vLLM's template extras, exactly as /v1/chat/completions does; Generate on a chat says what
Generate on those token ids says; a chat that cannot apply is INVALID_ARGUMENT naming the
field, and the server goes on serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from transformers import PreTrainedTokenizerFast

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.router.server_harness import Server
from tests.router.test_chat_template_options import CASES, CHAT, OPEN
from tests.router.test_openai_features import TIME, WEATHER

pytestmark = pytest.mark.timeout(300)

GREEDY = pb.SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tokenizer(llama: Path) -> Any:
    return PreTrainedTokenizerFast.from_pretrained(str(llama))


def chat_prompt(messages: list[dict[str, Any]], **fields: Any) -> pb.ChatPrompt:
    """The proto of a chat as /v1/chat/completions takes it (messages plus template fields)."""
    kwargs = fields.pop("chat_template_kwargs", None)
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(**m) for m in messages], **fields)
    if kwargs is not None:
        struct = struct_pb2.Struct()
        struct.update(kwargs)
        chat.chat_template_kwargs.CopyFrom(struct)
    return chat


def generate(stub: pb_grpc.GenerationServiceStub, **prompt: Any) -> list[pb.GenerateResponse]:
    return list(stub.Generate(pb.GenerateRequest(sampling_params=GREEDY, **prompt), timeout=60))


def test_chat_renders_and_generates_as_the_template_does(
    server: Server, stub: pb_grpc.GenerationServiceStub, tokenizer: Any
) -> None:
    named = [{"role": "system", "content": "be brief"}, {**CHAT[0], "name": "ada"}]
    cases = [*CASES, (named, {}, {"add_generation_prompt": True})]
    renders = []
    for messages, fields, template_args in cases:
        expected = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tokenize=False, **template_args),
            add_special_tokens=False,
        )
        renders.append(expected)
        chat = chat_prompt(messages, **fields)
        tokenized = stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=60)
        assert list(tokenized.token_ids) == expected, fields
        assert list(tokenized.tokens) == [tokenizer.decode([t]) for t in expected]
        got = generate(stub, chat=chat)
        plain = generate(stub, token_ids=pb.TokenIds(ids=expected))
        assert [t for m in got for t in m.token_ids] == [t for m in plain for t in m.token_ids]
        assert len([t for m in got for t in m.token_ids]) == 5
        assert got[-1].usage.prompt_tokens == len(expected)
    # Every option changed the prompt: none of them was dropped on the way.
    assert len({tuple(r) for r in renders}) == len(renders)
    server.wait_pool_free()


BAD: list[tuple[pb.ChatPrompt, str]] = [
    (pb.ChatPrompt(), "chat.messages: "),
    (chat_prompt([{"role": "robot", "content": "hi"}]), "chat.messages[0].role: "),
    (chat_prompt([{"role": "user"}]), "chat.messages[0].content: "),
    (chat_prompt(OPEN, continue_final_message=True), "continue_final_message: "),
    (
        chat_prompt(CHAT, add_generation_prompt=False, continue_final_message=True),
        "continue_final_message: ",
    ),
    (chat_prompt(CHAT, chat_template_kwargs={"tools": []}), "chat_template_kwargs: "),
    # The template itself refuses it (raise_exception).
    (chat_prompt(CHAT, chat_template_kwargs={"enable_thinking": "no"}), "messages: "),
]


@pytest.mark.parametrize("chat,prefix", BAD, ids=[p for _, p in BAD])
def test_a_chat_that_cannot_apply_is_invalid_argument(
    stub: pb_grpc.GenerationServiceStub, chat: pb.ChatPrompt, prefix: str
) -> None:
    calls = (
        lambda: generate(stub, chat=chat),
        lambda: stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=60),
    )
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(prefix), err.value.details()


def test_tokenize_takes_text_or_chat(server: Server, stub: pb_grpc.GenerationServiceStub) -> None:
    chat = chat_prompt(CHAT)
    for request, field in (
        (pb.TokenizeRequest(text="hello", chat=chat), "text"),
        (pb.TokenizeRequest(add_special_tokens=False, chat=chat), "add_special_tokens"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.Tokenize(request, timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(f"{field}: give text or chat"), err.value.details()
    # The server goes on serving everyone.
    assert sum(len(m.token_ids) for m in generate(stub, chat=chat)) == 5
    server.wait_pool_free()


# ---- tools ------------------------------------------------------------------------------------


def tool_proto(tool: dict[str, Any]) -> pb.Tool:
    """A tool as HTTP takes it ({"type": "function", "function": {...}}) in the proto."""
    f = tool["function"]
    parameters = json.dumps(f["parameters"]) if "parameters" in f else ""
    return pb.Tool(name=f["name"], description=f.get("description", ""), parameters=parameters)


def calls_of(msgs: list[pb.GenerateResponse]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for m in msgs for c in m.tool_calls]


ASK: Any = [{"role": "user", "content": "weather in Paris?"}]


@pytest.mark.parametrize(
    "http_choice,grpc_choice",
    [
        ("required", {"tool_choice_mode": "required"}),
        (
            {"type": "function", "function": {"name": "get_time"}},
            {"tool_choice_function": "get_time"},
        ),
    ],
    ids=["required", "named"],
)
def test_forced_tool_calls_are_http_s(
    server: Server, stub: pb_grpc.GenerationServiceStub, http_choice: Any, grpc_choice: Any
) -> None:
    """The same seeded chat with tools makes the same calls over gRPC as over HTTP, each
    whole, out of the text, with finish reason tool_calls."""
    with server.http(timeout=60) as http:
        r = http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": ASK, "tools": [WEATHER, TIME],
            "tool_choice": http_choice, "max_tokens": 300, "temperature": 1.0, "seed": 1,
        })  # fmt: skip
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    expected = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in choice["message"]["tool_calls"]
    ]
    chat = chat_prompt(ASK)
    chat.tools.extend([tool_proto(WEATHER), tool_proto(TIME)])
    for field, value in grpc_choice.items():
        setattr(chat, field, value)
    sp = pb.SamplingParams(max_tokens=300, temperature=1.0, seed=1)
    msgs = list(stub.Generate(pb.GenerateRequest(chat=chat, sampling_params=sp), timeout=60))
    assert expected and calls_of(msgs) == expected
    assert all(c.id.startswith("call_") for m in msgs for c in m.tool_calls)
    assert "".join(m.text for m in msgs).strip() == (choice["message"]["content"] or "")
    assert msgs[-1].finish_reason == choice["finish_reason"] == "tool_calls"
    assert sum(len(m.token_ids) for m in msgs) == r.json()["usage"]["completion_tokens"]
    server.wait_pool_free()


def test_auto_parses_what_the_model_writes(
    server: Server, stub: pb_grpc.GenerationServiceStub
) -> None:
    """tool_choice auto: a call the model writes (here steered into it by a grammar) comes
    back parsed, never as text; the text around it stays text; "none" parses nothing."""
    call = {"name": "get_time", "arguments": {"zone": "utc"}}
    block = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    lark = f'start: "Sure. " {json.dumps(block)}'
    steer = pb.StructuredOutput(kind="grammar", value=lark)
    sp = pb.SamplingParams(max_tokens=200, temperature=0, structured=steer)
    chat = chat_prompt(ASK)
    chat.tools.extend([tool_proto(WEATHER), tool_proto(TIME)])
    for mode, calls, text in (
        ("auto", [("get_time", {"zone": "utc"})], "Sure."),
        ("none", [], f"Sure. {block}"),
    ):
        chat.tool_choice_mode = mode
        msgs = list(stub.Generate(pb.GenerateRequest(chat=chat, sampling_params=sp), timeout=60))
        assert calls_of(msgs) == calls
        assert "".join(m.text for m in msgs).strip() == text
        assert msgs[-1].finish_reason == ("tool_calls" if calls else "stop")
        if calls:
            assert not any("<tool_call" in m.text for m in msgs)
    server.wait_pool_free()


def test_a_forced_call_cut_by_max_tokens_is_a_call_everywhere(
    server: Server, stub: pb_grpc.GenerationServiceStub
) -> None:
    """A named tool_choice cut short by max_tokens comes back as that tool's call with the
    arguments as far as they got and finish reason "length", over HTTP (whole and streamed)
    and gRPC alike, never as the grammar's text; a longer budget only extends the arguments."""
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    before = ""
    with server.http(timeout=60) as http:
        for max_tokens in (1, 5, 20, 38, 48):
            body = {"model": "tiny", "messages": ASK, "tools": [WEATHER, TIME],
                    "tool_choice": named, "max_tokens": max_tokens, "temperature": 1.0,
                    "seed": 1}  # fmt: skip
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
            [call] = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
            arguments = call["function"]["arguments"]
            assert arguments.startswith(before)
            before = arguments
            streamed, finish = [], None
            with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
                for line in s.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])["choices"][0]
                        assert not chunk["delta"].get("content")
                        streamed += chunk["delta"].get("tool_calls", [])
                        finish = chunk["finish_reason"] or finish
            assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed] == [
                ("get_weather", arguments)
            ]
            assert finish == "length"
            chat = chat_prompt(ASK, tool_choice_function="get_weather")
            chat.tools.extend([tool_proto(WEATHER), tool_proto(TIME)])
            sp = pb.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1)
            request = pb.GenerateRequest(chat=chat, sampling_params=sp)
            msgs = list(stub.Generate(request, timeout=60))
            assert [(c.name, c.arguments) for m in msgs for c in m.tool_calls] == [
                ("get_weather", arguments)
            ]
            assert "".join(m.text for m in msgs) == "" and msgs[-1].finish_reason == "length"
    assert before  # the longest budget reached the arguments
    server.wait_pool_free()


def test_tools_and_call_history_render_as_the_template_does(
    stub: pb_grpc.GenerationServiceStub, tokenizer: Any
) -> None:
    arguments = {"city": "Oslo", "unit": "c"}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}  # fmt: skip
    history: Any = [
        ASK[0],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"},
    ]
    expected = tokenizer.encode(
        tokenizer.apply_chat_template(
            history, tools=[WEATHER], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )
    chat = pb.ChatPrompt(
        messages=[
            pb.ChatMessage(role="user", content=ASK[0]["content"]),
            pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(
                id="call_1", name="get_weather", arguments=json.dumps(arguments))]),
            pb.ChatMessage(role="tool", tool_call_id="call_1", content="4 degrees"),
        ],
        tools=[tool_proto(WEATHER)],
    )  # fmt: skip
    got = stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=60).token_ids
    assert list(got) == expected
    # Without the tools the template renders something else: they were not dropped.
    del chat.tools[:]
    assert list(stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=60).token_ids) != expected


def _with_tools(**fields: Any) -> pb.ChatPrompt:
    chat = chat_prompt(ASK, **fields)
    chat.tools.append(tool_proto(WEATHER))
    return chat


BAD_TOOLS: list[tuple[pb.ChatPrompt, pb.SamplingParams | None, str]] = [
    (pb.ChatPrompt(messages=chat_prompt(ASK).messages, tools=[pb.Tool(name="no spaces")]),
     None, "chat.tools[0].name: "),
    *(
        (pb.ChatPrompt(messages=chat_prompt(ASK).messages,
                       tools=[pb.Tool(name="f", parameters=bad)]),
         None, "chat.tools[0].parameters: ")
        for bad in ("{", "[1]", '{"type": NaN}', '{"a": ' * 100 + "1" + "}" * 100)
    ),
    (_with_tools(tool_choice_mode="sometimes"), None, "chat.tool_choice_mode: "),
    (_with_tools(tool_choice_mode="required"), pb.SamplingParams(ignore_eos=True), "ignore_eos"),
    (_with_tools(tool_choice_function="nope"), None, "chat.tool_choice: "),
    (chat_prompt(ASK, tool_choice_mode="required"), None, "chat.tools: "),
    (_with_tools(tool_choice_mode="required"),
     pb.SamplingParams(structured=pb.StructuredOutput(kind="regex", value="a+")),
     "chat.tool_choice: "),
    (pb.ChatPrompt(messages=[*chat_prompt(ASK).messages, pb.ChatMessage(role="tool", content="4")]),
     None, "chat.messages[1].tool_call_id: "),
    (pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="x", tool_calls=[pb.ToolCall(
        id="c", name="f", arguments="{}")])]), None, "chat.messages[0].tool_calls: "),
]  # fmt: skip


@pytest.mark.parametrize("chat,params,prefix", BAD_TOOLS)
def test_bad_tools_are_invalid_argument(
    stub: pb_grpc.GenerationServiceStub,
    chat: pb.ChatPrompt,
    params: pb.SamplingParams | None,
    prefix: str,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(pb.GenerateRequest(chat=chat, sampling_params=params), timeout=60))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(prefix), err.value.details()
