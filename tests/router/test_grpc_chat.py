"""Chat prompts over gRPC (``GenerateRequest.chat``, ``TokenizeRequest.chat``) on a real
server, every mode: a chat renders as the tokenizer's ``apply_chat_template`` renders it with
vLLM's template extras, exactly as /v1/chat/completions does; Generate on a chat says what
Generate on those token ids says; a chat that cannot apply is INVALID_ARGUMENT naming the
field, and the server goes on serving."""

from __future__ import annotations

from collections.abc import Iterator
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

pytestmark = pytest.mark.timeout(300)

GREEDY = pb.SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[pb_grpc.GenerationServiceStub]:
    with server.grpc_channel() as channel:
        yield pb_grpc.GenerationServiceStub(channel)


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
    (chat_prompt([*CHAT, {"role": "tool", "content": "42"}]), "chat.messages[1].role: "),
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
