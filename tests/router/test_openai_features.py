"""Issue 19 through the official ``openai`` client against a real server (every mode): n > 1,
best_of, batched prompts, penalties, logit_bias, seed, chat logprobs, echo, stop, user,
structured outputs, tool calls (streaming and not). The walk over every field of the openai
package's request types is in ``test_openai_fields.py``."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.structured.spec import StructuredOutput
from pdserve import LLM, SamplingParams
from tests.router.server_harness import Server
from tests.structured_schemas import SCHEMAS

pytestmark = pytest.mark.timeout(600)

CHAT: Any = [{"role": "user", "content": "hello"}]
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "cet"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(server: Server) -> Any:  # Any: the tests send vLLM extras the stubs do not know
    return server.openai()


@pytest.fixture(scope="module")
def offline(llama: Path) -> LLM:
    return LLM(str(llama), dtype="float32", num_kv_blocks=64)


def _metric(server: Server, name: str) -> float:
    text = server.get("/metrics", timeout=10).text
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.MULTILINE)
    assert m is not None, name
    return float(m.group(1))


def test_n_greedy_is_n_identical_sequences_prefilled_once(server: Server, client: Any) -> None:
    prompt = list(range(5, 45))  # 40 tokens: 2 full blocks + 8
    counter = "pdserve_engine_prompt_tokens_computed_total"
    before = _metric(server, counter) if server.colocated else 0.0
    c = client.completions.create(
        model="tiny", prompt=prompt, n=4, max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert sorted(ch.index for ch in c.choices) == [0, 1, 2, 3]
    assert len({ch.text for ch in c.choices}) == 1
    assert c.usage is not None and c.usage.prompt_tokens == 40
    assert c.usage.completion_tokens == 20
    if server.colocated:
        # The leader computes the whole prompt; each sibling only its last partial block.
        assert _metric(server, counter) - before == 40 + 3 * 8
    stream = client.chat.completions.create(
        model="tiny", messages=CHAT, n=3, max_tokens=4, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts: dict[int, str] = {}
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    assert sorted(texts) == [0, 1, 2] and len(set(texts.values())) == 1
    server.wait_pool_free()


def test_n_seeded_equals_separate_seeded_requests(client: Any) -> None:
    common: dict[str, Any] = dict(model="tiny", prompt="the cache", max_tokens=6, temperature=1.0)
    together = client.completions.create(n=3, seed=11, **common)
    alone = [client.completions.create(seed=11 + j, **common).choices[0].text for j in range(3)]
    assert [ch.text for ch in sorted(together.choices, key=lambda c: c.index)] == alone
    again = client.completions.create(seed=11, **common).choices[0].text
    assert again == alone[0]  # seed: reproducible


def test_best_of_returns_the_most_likely(client: Any) -> None:
    common: dict[str, Any] = dict(model="tiny", prompt="the", max_tokens=4, temperature=1.0)
    best = client.completions.create(best_of=3, seed=5, **common)
    assert len(best.choices) == 1 and best.choices[0].logprobs is None
    runs = [
        client.completions.create(seed=5 + j, logprobs=0, **common).choices[0] for j in range(3)
    ]
    scores = [sum(r.logprobs.token_logprobs) for r in runs if r.logprobs]  # type: ignore[misc]
    assert best.choices[0].text == runs[scores.index(max(scores))].text


def test_batched_prompts_with_n(client: Any, offline: LLM) -> None:
    prompts = ["one", "two words", "three more words"]
    c = client.completions.create(
        model="tiny", prompt=prompts, n=2, max_tokens=3, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    refs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    by_index = {ch.index: ch.text for ch in c.choices}
    assert by_index == {p * 2 + j: refs[p].text for p in range(3) for j in range(2)}
    ids = [[5, 6, 7], [8, 9]]
    c2 = client.completions.create(model="tiny", prompt=ids, max_tokens=2, temperature=0)
    assert [ch.index for ch in c2.choices] == [0, 1]
    assert c2.usage is not None and c2.usage.prompt_tokens == 5
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(
        model="tiny", prompt=prompts, max_tokens=3, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    ):  # fmt: skip
        for ch in chunk.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + ch.text
    assert streamed == {p: refs[p].text for p in range(3)}


def test_penalties_bias_echo_stop_user_match_the_engine(client: Any, offline: LLM) -> None:
    prompt = [5, 9, 40, 41, 42]
    for extra in (
        {"presence_penalty": 1.5, "frequency_penalty": 0.7},
        {"repetition_penalty": 1.4},
    ):
        params: Any = extra
        ref = offline.generate({"prompt_token_ids": prompt}, SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True, **params))[0]  # fmt: skip
        body = {k: v for k, v in extra.items() if k != "repetition_penalty"}
        c = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=8, temperature=0, **body,
            extra_body={"ignore_eos": True, **{k: v for k, v in extra.items() if k not in body}},
        )  # fmt: skip
        assert c.choices[0].text == ref.text, extra
    biased = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=5, temperature=0, logit_bias={"77": 100},
        logprobs=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert biased.choices[0].logprobs is not None
    token_strs = biased.choices[0].logprobs.tokens or []
    assert len(set(token_strs)) == 1
    echo = client.completions.create(model="tiny", prompt="hello there", echo=True, max_tokens=3,
                                     temperature=0, user="someone")  # fmt: skip
    plain = client.completions.create(
        model="tiny", prompt="hello there", max_tokens=3, temperature=0
    )
    assert echo.choices[0].text == "hello there" + plain.choices[0].text
    stops = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=16, temperature=0, stop=["a", "b", "c", "d"],
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert not any(s in stops.choices[0].text for s in "abcd")


def test_chat_logprobs(client: Any) -> None:
    chat = client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    lp = chat.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lp.content)


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_through_the_openai_client(client: Any, stream: bool) -> None:
    def run_chat(**kw: Any) -> str:
        out = client.chat.completions.create(
            model="tiny", messages=CHAT, max_tokens=300, temperature=1.0, seed=1, stream=stream,
            **kw,
        )  # fmt: skip
        if stream:
            return "".join(ch.choices[0].delta.content or "" for ch in out if ch.choices)  # type: ignore[union-attr]
        return out.choices[0].message.content or ""  # type: ignore[union-attr]

    schema = SCHEMAS[0]
    text = run_chat(response_format={"type": "json_schema", "json_schema": {
        "name": "person", "schema": schema, "strict": True}})  # fmt: skip
    jsonschema.validate(json.loads(text), schema)
    # Any object: strings are unbounded, so a random model may run out of tokens inside one;
    # whatever it writes is a prefix of an object (checked in full with bounded schemas).
    anything = run_chat(response_format={"type": "json_object"})
    assert anything.startswith("{")
    assert re.fullmatch(
        r"[0-9]{3}-[a-z]{2}", run_chat(extra_body={"guided_regex": r"[0-9]{3}-[a-z]{2}"})
    )
    assert run_chat(extra_body={"guided_choice": ["left", "right"]}) in ("left", "right")
    assert run_chat(extra_body={"guided_grammar": 'root ::= "yes" | "no"'}) in ("yes", "no")
    assert run_chat(extra_body={"structured_outputs": {"choice": ["up", "down"]}}) in ("up", "down")
    c = client.completions.create(
        model="tiny", prompt="json:", max_tokens=300, seed=1,
        extra_body={"guided_json": SCHEMAS[7]}, stream=stream,
    )  # fmt: skip
    text = "".join(ch.choices[0].text for ch in c) if stream else c.choices[0].text  # type: ignore[union-attr]
    jsonschema.validate(json.loads(text), SCHEMAS[7])


def test_twenty_schemas_all_valid(server: Server) -> None:
    """The grammar alone makes a random-weight model's output valid: 100% on >= 20 schemas."""
    assert len(SCHEMAS) >= 20
    with server.http(timeout=300) as http:
        for i, schema in enumerate(SCHEMAS):
            r = http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"schema {i}"}], "max_tokens": 400,
                "temperature": 1.0, "seed": i,
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}",
                                    "schema": schema, "strict": True}}})  # fmt: skip
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    server.wait_pool_free()


def _arguments_valid(calls: list[dict[str, Any]]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"]
        jsonschema.validate(
            json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]]
        )


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls(client: Any, stream: bool) -> None:
    def run(**kw: Any) -> tuple[str | None, list[dict[str, Any]], str | None]:
        out = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[WEATHER, TIME], max_tokens=300, temperature=1.0, seed=1, stream=stream, **kw,
        )  # fmt: skip
        if not stream:
            msg = out.choices[0].message  # type: ignore[union-attr]
            whole = [c.model_dump() for c in msg.tool_calls or []]
            return msg.content, whole, out.choices[0].finish_reason  # type: ignore[union-attr]
        content, finish = "", None
        calls: dict[int, dict[str, Any]] = {}
        for chunk in out:  # type: ignore[union-attr]
            ch = chunk.choices[0]
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                calls[d.index] = {
                    "id": d.id,
                    "type": d.type,
                    "function": {"name": d.function.name, "arguments": d.function.arguments},
                }  # type: ignore[union-attr]
            finish = ch.finish_reason or finish
        return content or None, [calls[i] for i in sorted(calls)], finish

    content, calls, finish = run(tool_choice="required")
    _arguments_valid(calls)
    assert finish == "tool_calls"
    _, calls, finish = run(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_time" and finish == "tool_calls"
    _arguments_valid(calls)
    content, calls, finish = run(tool_choice="none", extra_body={"ignore_eos": True})
    assert calls == [] and content and finish == "length"
    # A conversation that carries a call and its result renders and runs.
    history = client.chat.completions.create(model="tiny", max_tokens=3, tools=[WEATHER], messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"},
    ])  # fmt: skip
    assert history.choices[0].message.role == "assistant"


def test_tokenize_detokenize_and_models(server: Server, offline: LLM) -> None:
    with server.http(timeout=30) as http:
        r = http.post("/tokenize", json={"model": "tiny", "prompt": "hello there",
                                         "return_token_strs": True})  # fmt: skip
        body = r.json()
        assert body["tokens"] == offline.tokenizer.encode("hello there")
        assert body["count"] == len(body["tokens"]) == len(body["token_strs"])
        assert body["max_model_len"] == 1024
        chat = http.post("/tokenize", json={"messages": CHAT}).json()
        rendered = offline.tokenizer.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=True
        )
        assert chat["tokens"] == offline.tokenizer.encode(rendered, add_special_tokens=False)
        assert chat["token_strs"] is None
        d = http.post("/detokenize", json={"tokens": body["tokens"]}).json()
        assert d == {"prompt": offline.tokenizer.decode(body["tokens"])}
        bad = http.post("/detokenize", json={"tokens": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        listed = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in listed] == ["tiny"]
        assert 0 < listed[0]["created"] <= time.time()
        # OpenAI's retrieve-model: the same card; an unknown name is a 404 in OpenAI's body.
        assert http.get("/v1/models/tiny").json() == listed[0]
        gone = http.get("/v1/models/org/other-model")
        assert gone.status_code == 404 and gone.json()["error"]["param"] == "model", gone.text


def test_openapi_documents_every_body(server: Server) -> None:
    doc = server.get("/openapi.json", timeout=10).json()
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]
        assert op["responses"]["200"]["content"]["application/json"]["schema"]
        assert op["responses"]["400"]["content"]["application/json"]["schema"]
    for path in ("/v1/models", "/v1/models/{model}", "/health"):
        assert doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
    names = doc["components"]["schemas"]
    assert {"CompletionRequest", "ChatCompletionRequest", "CompletionResponse",
            "ChatCompletionChunk", "ErrorResponse"} <= set(names)  # fmt: skip


def test_bad_structured_outputs_are_400(server: Server) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"guided_regex": "[a-"}, "guided_regex"),
        ({"guided_json": {"type": "objekt"}}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_grammar": "start: nope"}, "guided_grammar"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]},
         "tool_choice"),
        ({"logit_bias": {"100000": 1}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"n": 2, "best_of": 1}, "best_of"),
    ]  # fmt: skip
    with server.http(timeout=30) as http:
        for extra, param in cases:
            r = http.post("/v1/chat/completions", json={"messages": CHAT, **extra})
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["param"] == param, (extra, r.json())
    assert StructuredOutput("choice", '["a"]').to_grammar()


def test_served_name_aliases_and_the_model_path(llama: Path) -> None:
    from tests.router.server_harness import start_server

    s = start_server(llama, "--served-model-name", "second", "--max-model-len", "256")
    try:
        models = s.get("/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["tiny", "second"]  # the harness names it "tiny"
        for name in ("tiny", "second", str(llama)):
            r = s.post("/v1/completions", timeout=60,
                       json={"model": name, "prompt": "hi", "max_tokens": 2})  # fmt: skip
            assert r.status_code == 200, (name, r.text)
        r = s.post("/v1/completions", json={"model": "third", "prompt": "hi"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    finally:
        assert s.stop() == 0
