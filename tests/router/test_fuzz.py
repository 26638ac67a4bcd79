"""Fuzzing the public APIs of a real server (issue 12): property-based request bodies over
HTTP and gRPC (hypothesis) and schema-driven requests from the router's own ``/openapi.json``
(schemathesis). No request gets a 5xx or INTERNAL, none stalls, every stream ends, and the
server still serves with its KV pool free afterwards.

Bounded: a fixed number of examples each, derandomized (the same examples every run), against
a server whose ``max_model_len`` of 64 keeps every generation short.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.router.server_harness import Server, start_server

pytestmark = pytest.mark.timeout(600)

FUZZ_MAX_MODEL_LEN = 64
VOCAB = 823  # the tiny test models share the demo tokenizer
FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
OK_STATUSES = {200, 400, 404, 413, 429}


@pytest.fixture(scope="module")
def fuzz_server(llama: Path) -> Iterator[Server]:
    s = start_server(
        llama, "--num-kv-blocks", "32", "--max-model-len", str(FUZZ_MAX_MODEL_LEN),
        "--max-queue", "64",
    )  # fmt: skip
    yield s
    assert s.stop() == 0, "".join(s.lines)


# --------------------------------------------------------------------------- values
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-3, 70)
    | st.floats()  # NaN and infinities go out as JSON's NaN / Infinity literals
    | st.floats(-3, 3)
    | st.text(max_size=12)
)
json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
_token_ids = st.lists(st.integers(-5, VOCAB + 5), min_size=0, max_size=12)
_texts = (
    st.text(max_size=40)
    | st.text(alphabet=st.characters(exclude_categories=()), max_size=40)  # surrogates too
    | st.tuples(st.text(max_size=6), st.sampled_from(["\ud800", "\udfff", "\ud83d"])).map("".join)
)
_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"])},
        optional={"content": _texts | st.none() | st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url"]), "text": _texts}), max_size=2),
            "name": _texts},
    ),
    max_size=3,
)  # fmt: skip

# Per field: plausible values of the right shape (edges included) or anything at all.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["tiny", "", "other"]),
    "prompt": _texts | _token_ids | st.lists(_texts, max_size=3) | st.lists(_token_ids, max_size=3),
    "messages": _messages,
    "max_tokens": st.integers(-2, 80) | st.none(),
    "max_completion_tokens": st.integers(-2, 80) | st.none(),
    "min_tokens": st.integers(-2, 80),
    "temperature": st.floats(-1, 3) | st.none(),
    "top_p": st.floats(-0.5, 1.5) | st.none(),
    "top_k": st.integers(-3, VOCAB + 3),
    "n": st.integers(-1, 3),
    "seed": st.integers(-(2**64), 2**64) | st.sampled_from([2**64, -(2**63) - 1]) | st.none(),
    "stop": _texts | st.lists(_texts, max_size=20) | st.none(),
    "stop_token_ids": _token_ids,
    "ignore_eos": st.booleans(),
    "logprobs": st.integers(-2, 25) | st.booleans() | st.none(),
    "top_logprobs": st.integers(-2, 25) | st.none(),
    "echo": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.none() | st.fixed_dictionaries({"include_usage": st.booleans()}),
    "presence_penalty": st.floats(-3, 3),
    "frequency_penalty": st.floats(-3, 3),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "priority": st.integers(-(2**40), 2**40),
    "timeout": st.floats(-1, 30) | st.none(),
    "user": _texts,
    "best_of": st.integers(0, 4) | st.none(),
    "repetition_penalty": st.floats(-1, 3) | st.none(),
    "logit_bias": st.dictionaries(
        st.integers(-3, VOCAB + 3).map(str) | _texts, st.floats(-150, 150), max_size=3
    ),
    "response_format": st.sampled_from(
        [
            {"type": "text"},
            {"type": "json_object"},
            {"type": "x"},
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "s",
                    "schema": {"type": "integer", "minimum": 0, "maximum": 9},
                },
            },
            {"type": "json_schema"},
        ]
    ),
    "guided_regex": st.sampled_from(["[0-9]{2}", "[a-", "(a|b)+c", ""]),
    "guided_choice": st.lists(_texts, max_size=3),
    "guided_json": st.sampled_from([{"type": "boolean"}, {"type": "nope"}, "{", "[1]"]),
    "guided_grammar": st.sampled_from(['root ::= "a" | "b"', "start: x", 'start: "q"+']),
    "tools": st.sampled_from(
        [
            [],
            [{"type": "function", "function": {"name": "f"}}],
            [{"type": "function", "function": {"name": "bad name!"}}],
            [{"type": "x"}],
        ]
    ),
    "tool_choice": st.sampled_from(
        ["none", "auto", "required", "x", {"type": "function", "function": {"name": "f"}}]
    ),
    "store": st.booleans(),
    "suffix": _texts,
}
_field_value = st.sampled_from(sorted(FIELDS)).flatmap(
    lambda f: st.tuples(st.just(f), FIELDS[f] | json_values)
)
_bases = st.sampled_from(
    [
        ("completions", {"prompt": [5, 6, 7], "max_tokens": 4}),
        ("completions", {"prompt": "hello there", "max_tokens": 4, "temperature": 0}),
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ]
)
_mutated = st.tuples(_bases, st.lists(_field_value, max_size=5)).map(
    lambda t: (t[0][0], {**t[0][1], **dict(t[1])})
)
# Valid bodies whose only odd part is the text: it reaches the tokenizer.
_odd_texts = _texts.map(
    lambda t: ("completions", {"prompt": t or "x", "max_tokens": 2})
) | _texts.map(
    lambda t: ("chat/completions", {"messages": [{"role": "user", "content": t}], "max_tokens": 2})
)
bodies = _mutated | _odd_texts


def _check_http_answer(r: httpx.Response, streamed: bool) -> None:
    assert r.status_code in OK_STATUSES, (r.status_code, r.text)
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"], err
        return
    if not streamed:
        assert r.json()["choices"], r.text
        return
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", r.text  # every stream ends
    for e in events[:-1]:
        data = json.loads(e)
        if "error" in data:  # the status line was already sent
            assert data["error"]["code"] in OK_STATUSES - {200} | {504}, data


def _post(client: httpx.Client, path: str, content: bytes) -> httpx.Response:
    return client.post(f"/v1/{path}", content=content, headers={"content-type": "application/json"})


@FUZZ
@given(case=bodies)
def test_fuzz_http_bodies(fuzz_server: Server, case: tuple[str, dict[str, Any]]) -> None:
    path, body = case
    with fuzz_server.http(timeout=60) as client:
        content = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
        r = _post(client, path, content)
        _check_http_answer(r, bool(body.get("stream")) and r.status_code == 200)


@FUZZ
@given(
    path=st.sampled_from(["completions", "chat/completions"]),
    raw=st.binary(max_size=64)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.tuples(st.sampled_from("[{"), st.integers(1, 5000)).map(lambda t: (t[0] * t[1]).encode()),
)
def test_fuzz_http_raw_bytes(fuzz_server: Server, path: str, raw: bytes) -> None:
    with fuzz_server.http(timeout=60) as client:
        r = _post(client, path, raw)
        assert r.status_code in OK_STATUSES, (r.status_code, r.text)
        assert r.status_code != 200 or r.json()["choices"]


# ----------------------------------------------------------------------------- gRPC
def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_int32 = st.integers(-(2**31), 2**31 - 1)
_doubles = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-2, 3)
_sampling = st.builds(
    lambda d: pb.SamplingParams(**{k: v for k, v in d.items() if v is not None}),
    st.fixed_dictionaries(
        {},
        optional={
            "max_tokens": st.integers(-2, 80) | _int32,
            "min_tokens": st.integers(-2, 80) | _int32,
            "temperature": _doubles,
            "top_k": st.integers(-2, VOCAB + 2) | _int32,
            "top_p": _doubles,
            "seed": st.integers(-(2**63), 2**63 - 1),
            "presence_penalty": _doubles,
            "frequency_penalty": _doubles,
            "repetition_penalty": _doubles,
            "logit_bias": st.dictionaries(st.integers(-5, VOCAB + 5) | _int32, _doubles,
                                          max_size=3),
            "structured": st.builds(pb.StructuredOutput, kind=st.sampled_from(
                ["json", "json_object", "regex", "choice", "grammar", "", "x"]),
                value=st.sampled_from(["", "[0-9]", '["a"]', '{"type": "integer"}', "[a-"])),
            "stop": st.lists(st.text(max_size=20).filter(_encodable), max_size=20),
            "stop_token_ids": st.lists(_int32 | st.integers(-2, VOCAB + 2), max_size=5),
            "ignore_eos": st.booleans(),
            "logprobs": st.integers(-2, 25) | _int32,
            "include_stop_str_in_output": st.booleans(),
            "skip_special_tokens": st.booleans(),
        },
    ),
)  # fmt: skip


def _grpc_request(d: dict[str, Any]) -> pb.GenerateRequest:
    req = pb.GenerateRequest(
        sampling_params=d["sampling_params"],
        priority=d["priority"],
        model=d["model"],
        n=d["n"],
        best_of=d["best_of"],
    )
    if d["prompt"] is None:
        pass
    elif isinstance(d["prompt"], str):
        req.text = d["prompt"]
    else:
        req.token_ids.ids.extend(d["prompt"])
    return req


grpc_requests = st.fixed_dictionaries(
    {
        "sampling_params": _sampling,
        "priority": _int32,
        "model": st.sampled_from(["", "tiny", "other"]),
        "n": st.integers(-1, 3),
        "best_of": st.integers(-1, 4),
        "prompt": st.none()
        | st.text(max_size=40).filter(_encodable)
        | st.lists(st.integers(-5, VOCAB + 5) | _int32, max_size=12),
    }
).map(_grpc_request)
GRPC_OK = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def channel(fuzz_server: Server) -> Iterator[grpc.Channel]:
    with fuzz_server.grpc_channel() as ch:
        yield ch


@FUZZ
@given(request_msg=grpc_requests)
def test_fuzz_grpc_generate(channel: grpc.Channel, request_msg: pb.GenerateRequest) -> None:
    stub = pb_grpc.GenerationServiceStub(channel)
    try:
        msgs = list(stub.Generate(request_msg, timeout=60))
    except grpc.RpcError as e:
        assert e.code() in GRPC_OK, (e.code(), e.details())
        assert e.details()
        return
    assert msgs and msgs[-1].finished and msgs[-1].finish_reason in ("stop", "length")


@FUZZ
@given(raw=st.binary(max_size=96), text=st.text(max_size=40).filter(_encodable))
def test_fuzz_grpc_raw_bytes_and_tokenize(channel: grpc.Channel, raw: bytes, text: str) -> None:
    call = channel.unary_stream(
        "/pdserve.v1.GenerationService/Generate",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        list(call(raw, timeout=60))
    except grpc.RpcError as e:
        assert e.code() in GRPC_OK, (e.code(), e.details())
    stub = pb_grpc.GenerationServiceStub(channel)
    tok = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=30)
    assert len(tok.tokens) == len(tok.token_ids)


# ------------------------------------------------------------------- schemathesis
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_schemathesis_against_the_openapi_document(fuzz_server: Server, mode: str) -> None:
    """Every operation of ``/openapi.json``: schema-valid bodies (positive) and bodies that
    break the schema (negative)."""
    from schemathesis import GenerationMode
    from schemathesis.checks import (
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, response_schema_conformance]

    schema = schemathesis.openapi.from_url(f"{fuzz_server.http_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    paths = {op.path for op in operations}
    assert {"/v1/completions", "/v1/chat/completions"} <= paths, paths
    for op in operations:
        if mode == "negative" and op.method.upper() == "GET":
            continue  # nothing to break: no parameters, no body

        @settings(max_examples=40, deadline=None, derandomize=True, database=None)
        @given(case=op.as_strategy(GenerationMode(mode)))
        def check(case: Any) -> None:
            case.call_and_validate(base_url=fuzz_server.http_url, checks=checks, timeout=60)

        check()


def test_still_serves_after_fuzzing(fuzz_server: Server) -> None:
    """Runs last in this module: the server answers, quickly, with its pool free."""
    r = fuzz_server.post(
        "/v1/completions",
        json={"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert fuzz_server.wait_pool_free(30)["status"] == "ok"
