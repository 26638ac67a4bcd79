"""vLLM's chat template extras on a real server (every mode): ``add_generation_prompt``,
``continue_final_message`` and ``chat_template_kwargs`` render the prompt as the tokenizer's
``apply_chat_template`` does with them, on /tokenize and on chat completions alike, and
options that cannot apply are a 400 naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from tests.router.server_harness import Server

pytestmark = pytest.mark.timeout(300)

CHAT: Any = [{"role": "user", "content": "hello"}]
OPEN: Any = [*CHAT, {"role": "assistant", "content": "the cache is"}]

# (messages, request fields, apply_chat_template's arguments)
CASES: list[tuple[Any, dict[str, Any], dict[str, Any]]] = [
    (CHAT, {}, {"add_generation_prompt": True}),
    (CHAT, {"add_generation_prompt": False}, {"add_generation_prompt": False}),
    (
        OPEN,
        {"add_generation_prompt": False, "continue_final_message": True},
        {"add_generation_prompt": False, "continue_final_message": True},
    ),
    (
        CHAT,
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"add_generation_prompt": True, "enable_thinking": False},
    ),
]


@pytest.fixture(scope="module")
def tokenizer(llama: Path) -> Any:
    return PreTrainedTokenizerFast.from_pretrained(str(llama))


def test_options_render_as_the_template_does(server: Server, tokenizer: Any) -> None:
    renders = []
    with server.http(timeout=60) as http:
        for messages, fields, template_args in CASES:
            expected = tokenizer.encode(
                tokenizer.apply_chat_template(messages, tokenize=False, **template_args),
                add_special_tokens=False,
            )
            renders.append(expected)
            got = http.post("/tokenize", json={"messages": messages, **fields})
            assert got.status_code == 200, got.text
            assert got.json()["tokens"] == expected, fields
            # The chat completion runs on that prompt: greedy, it says what a completion on
            # the rendered token ids says.
            common = {"model": "tiny", "max_tokens": 5, "temperature": 0}
            chat = http.post("/v1/chat/completions", json={"messages": messages, **fields,
                                                           **common})  # fmt: skip
            assert chat.status_code == 200, chat.text
            assert chat.json()["usage"]["prompt_tokens"] == len(expected)
            plain = http.post("/v1/completions", json={"prompt": expected, **common}).json()
            assert chat.json()["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
    # Every option changed the prompt: none of them was dropped on the way.
    assert len({tuple(r) for r in renders}) == len(renders)
    server.wait_pool_free()


def test_options_that_cannot_apply_are_400(server: Server) -> None:
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (OPEN, {"continue_final_message": True}, "continue_final_message"),  # with the prompt
        (CHAT, {"add_generation_prompt": False, "continue_final_message": True},
         "continue_final_message"),  # the last message is the user's
        (CHAT, {"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        (CHAT, {"chat_template_kwargs": {"add_generation_prompt": False}},
         "chat_template_kwargs"),
        (CHAT, {"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        (CHAT, {"continue_final_message": "yes"}, "continue_final_message"),
        # The template itself refuses it (raise_exception): a 400, not a 500.
        (CHAT, {"chat_template_kwargs": {"enable_thinking": "no"}}, "messages"),
    ]  # fmt: skip
    with server.http(timeout=60) as http:
        for messages, fields, param in cases:
            for path in ("/tokenize", "/v1/chat/completions"):
                body = {"model": "tiny", "messages": messages, "max_tokens": 2, **fields}
                if path == "/tokenize":
                    del body["max_tokens"]
                r = http.post(path, json=body)
                assert r.status_code == 400, (path, fields, r.text)
                assert r.json()["error"]["param"] == param, (path, fields, r.text)
        # The server goes on serving.
        ok = http.post("/v1/chat/completions", json={"model": "tiny", "messages": CHAT,
                                                     "max_tokens": 2})  # fmt: skip
        assert ok.status_code == 200
    server.wait_pool_free()
