"""No OpenAI parameter is ever silently ignored (issue 19): every field of the installed
``openai`` package's request types is either implemented (an example exercising it gets 200)
or refused with a 400 naming it; an unknown field is refused too. Adding a field to the
openai package fails this test until the field is classified here."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from tests.router.server_harness import Server
from tests.router.test_openai_features import CHAT, TIME, WEATHER

pytestmark = pytest.mark.timeout(600)


# Every field of the installed openai package's request types: an example that exercises it,
# and whether this server implements it ("ok": 200) or refuses it ("refused": 400 naming it).
COMPLETION_FIELDS: dict[str, tuple[Any, str]] = {
    "best_of": ({"best_of": 2}, "ok"),
    "echo": ({"echo": True}, "ok"),
    "frequency_penalty": ({"frequency_penalty": 0.5}, "ok"),
    "logit_bias": ({"logit_bias": {"5": 2.0}}, "ok"),
    "logprobs": ({"logprobs": 2}, "ok"),
    "max_tokens": ({"max_tokens": 3}, "ok"),
    "model": ({"model": "tiny"}, "ok"),
    "n": ({"n": 2}, "ok"),
    "presence_penalty": ({"presence_penalty": 0.5}, "ok"),
    "prompt": ({"prompt": ["a", "b"]}, "ok"),
    "seed": ({"seed": 3}, "ok"),
    "stop": ({"stop": ["x", "y"]}, "ok"),
    "stream_options": ({"stream": True, "stream_options": {"include_usage": True}}, "ok"),
    "suffix": ({"suffix": "the end"}, "refused"),
    "temperature": ({"temperature": 0.5}, "ok"),
    "top_p": ({"top_p": 0.9}, "ok"),
    "user": ({"user": "u-1"}, "ok"),
}
CHAT_FIELDS: dict[str, tuple[Any, str]] = {
    "audio": ({"audio": {"voice": "alloy", "format": "wav"}}, "refused"),
    "frequency_penalty": ({"frequency_penalty": -0.5}, "ok"),
    "function_call": ({"function_call": "auto"}, "refused"),
    "functions": ({"functions": [WEATHER["function"]]}, "refused"),
    "logit_bias": ({"logit_bias": {"5": -2.0}}, "ok"),
    "logprobs": ({"logprobs": True}, "ok"),
    "max_completion_tokens": ({"max_tokens": None, "max_completion_tokens": 3}, "ok"),
    "max_tokens": ({"max_tokens": 3}, "ok"),
    "messages": ({"messages": [{"role": "system", "content": "s"}, *CHAT]}, "ok"),
    "metadata": ({"metadata": {"k": "v"}}, "refused"),
    "modalities": ({"modalities": ["text", "audio"]}, "refused"),
    "model": ({"model": "tiny"}, "ok"),
    "moderation": ({"moderation": {"model": "x"}}, "refused"),
    "n": ({"n": 2}, "ok"),
    "parallel_tool_calls": ({"parallel_tool_calls": False, "tools": [WEATHER]}, "ok"),
    "prediction": ({"prediction": {"type": "content", "content": "x"}}, "refused"),
    "presence_penalty": ({"presence_penalty": 1.0}, "ok"),
    "prompt_cache_key": ({"prompt_cache_key": "k"}, "refused"),
    "prompt_cache_options": ({"prompt_cache_options": {"a": 1}}, "refused"),
    "prompt_cache_retention": ({"prompt_cache_retention": "24h"}, "refused"),
    "reasoning_effort": ({"reasoning_effort": "low"}, "refused"),
    "response_format": ({"response_format": {"type": "json_object"}}, "ok"),
    "safety_identifier": ({"safety_identifier": "s-1"}, "ok"),
    "seed": ({"seed": 4}, "ok"),
    "service_tier": ({"service_tier": "flex"}, "refused"),
    "stop": ({"stop": "x"}, "ok"),
    "store": ({"store": True}, "refused"),
    "stream_options": ({"stream": True, "stream_options": {"include_usage": True}}, "ok"),
    "temperature": ({"temperature": 0.3}, "ok"),
    "tool_choice": ({"tool_choice": "required", "tools": [WEATHER], "max_tokens": 300}, "ok"),
    "tools": ({"tools": [WEATHER, TIME]}, "ok"),
    "top_logprobs": ({"logprobs": True, "top_logprobs": 3}, "ok"),
    "top_p": ({"top_p": 0.5}, "ok"),
    "user": ({"user": "u-2"}, "ok"),
    "verbosity": ({"verbosity": "low"}, "refused"),
    "web_search_options": ({"web_search_options": {}}, "refused"),
}


def _openai_fields(typed_dict: Any) -> set[str]:
    return set(typing.get_type_hints(typed_dict, include_extras=True)) - {"stream"}


@pytest.mark.parametrize(
    ("path", "base", "table", "typed"),
    [
        ("completions", {"prompt": "hi", "max_tokens": 3}, COMPLETION_FIELDS,
         completion_params.CompletionCreateParamsBase),
        ("chat/completions", {"messages": CHAT, "max_tokens": 3}, CHAT_FIELDS,
         chat_params.CompletionCreateParamsBase),
    ],
    ids=["completions", "chat"],
)  # fmt: skip
def test_every_openai_field_is_implemented_or_refused(
    server: Server, path: str, base: dict[str, Any], table: dict[str, Any], typed: Any
) -> None:
    assert set(table) == _openai_fields(typed), "classify every field of the openai package"
    with server.http(timeout=120) as http:
        for name, (extra, expect) in table.items():
            r = http.post(f"/v1/{path}", json={**base, **extra})
            if expect == "ok":
                assert r.status_code == 200, (name, r.text)
            else:
                assert r.status_code == 400, (name, r.text)
                err = r.json()["error"]
                assert err["param"] == name and name in err["message"], err
        r = http.post(f"/v1/{path}", json={**base, "no_such_field": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "no_such_field"
    server.wait_pool_free()
