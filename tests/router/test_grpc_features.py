"""Issue 19 over gRPC (the proto carries the same fields as HTTP): n with per-sequence
``index``, best_of, penalties, logit bias and structured outputs, against every mode."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import jsonschema
import pytest

from engine.structured.spec import StructuredOutput
from pdserve import LLM, SamplingParams
from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.router.server_harness import Server
from tests.structured_schemas import SCHEMAS

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def offline(llama: Path) -> LLM:
    return LLM(str(llama), dtype="float32", num_kv_blocks=64)


def _by_index(msgs: list[pb.GenerateResponse]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for m in msgs:
        out.setdefault(m.index, []).extend(m.token_ids)
    return out


def test_n_and_best_of(server: Server, stub: pb_grpc.GenerationServiceStub) -> None:
    sp = pb.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    msgs = list(
        stub.Generate(pb.GenerateRequest(text="hello", sampling_params=sp, n=3), timeout=60)
    )
    seqs = _by_index(msgs)
    assert sorted(seqs) == [0, 1, 2] and len({tuple(s) for s in seqs.values()}) == 1
    assert sum(m.finished for m in msgs) == 3
    seeded = pb.SamplingParams(max_tokens=4, temperature=1.0, seed=21, ignore_eos=True)
    best = list(stub.Generate(pb.GenerateRequest(text="hello", sampling_params=seeded, n=1,
                                                 best_of=3), timeout=60))  # fmt: skip
    assert len(best) == 1 and best[0].finished and len(best[0].token_ids) == 4
    assert not best[0].logprobs  # not asked for
    server.wait_pool_free()


def test_penalties_bias_and_structured(stub: pb_grpc.GenerationServiceStub, offline: LLM) -> None:
    prompt = [5, 9, 40, 41, 42]
    ref = offline.generate({"prompt_token_ids": prompt}, SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True, presence_penalty=1.0,
        frequency_penalty=0.5, repetition_penalty=1.3))[0]  # fmt: skip
    sp = pb.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, presence_penalty=1.0,
                           frequency_penalty=0.5, repetition_penalty=1.3)  # fmt: skip
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), sampling_params=sp)
    assert [t for m in stub.Generate(req, timeout=60) for t in m.token_ids] == ref.token_ids
    biased = pb.SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logit_bias={77: 100})
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), sampling_params=biased)
    assert [t for m in stub.Generate(req, timeout=60) for t in m.token_ids] == [77] * 5
    spec = StructuredOutput("json", json.dumps(SCHEMAS[7]))
    grammar = pb.StructuredOutput(kind=spec.kind, value=spec.value)
    structured = pb.SamplingParams(max_tokens=300, temperature=1.0, seed=4, structured=grammar)
    msgs = list(
        stub.Generate(pb.GenerateRequest(text="json", sampling_params=structured), timeout=60)
    )
    assert msgs[-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(m.text for m in msgs)), SCHEMAS[7])


@pytest.mark.parametrize(
    ("request_msg", "field"),
    [
        (pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(
            structured=pb.StructuredOutput(kind="yaml"))), "structured"),
        (pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(
            structured=pb.StructuredOutput(kind="regex", value="[a-"))), "structured"),
        (pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(
            logit_bias={10**6: 1.0})), "logit_bias"),
        (pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(
            repetition_penalty=0)), "repetition_penalty"),
        (pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(
            presence_penalty=3)), "presence_penalty"),
        (pb.GenerateRequest(text="x", n=3, best_of=2), "best_of"),
        (pb.GenerateRequest(text="x", n=1000), "n"),
    ],
    ids=["kind", "regex", "bias", "repetition", "presence", "best_of < n", "n too big"],
)  # fmt: skip
def test_bad_new_fields_are_invalid_argument(
    stub: pb_grpc.GenerationServiceStub, request_msg: pb.GenerateRequest, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(request_msg, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert field in (info.value.details() or "")


def test_detokenize_is_http_s(server: Server, stub: pb_grpc.GenerationServiceStub) -> None:
    """Detokenize gives /detokenize's text (special tokens kept) for Tokenize's ids; an id
    outside the vocabulary or another model's name is refused."""
    ids = list(stub.Tokenize(pb.TokenizeRequest(text="the cache is 東京 😀"), timeout=30).token_ids)
    got = stub.Detokenize(pb.DetokenizeRequest(token_ids=ids), timeout=30).text
    with server.http(timeout=30) as http:
        assert got == http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert "the cache is 東京 😀" in got
    for request, code, field in (
        (pb.DetokenizeRequest(token_ids=[5, 10**6]), grpc.StatusCode.INVALID_ARGUMENT,
         "token_ids: "),
        (pb.DetokenizeRequest(token_ids=[5, -1]), grpc.StatusCode.INVALID_ARGUMENT, "token_ids: "),
        (pb.DetokenizeRequest(token_ids=ids, model="other"), grpc.StatusCode.NOT_FOUND,
         "model: "),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as info:
            stub.Detokenize(request, timeout=30)
        assert info.value.code() == code
        assert (info.value.details() or "").startswith(field), info.value.details()
    assert stub.Detokenize(pb.DetokenizeRequest(), timeout=30).text == ""
