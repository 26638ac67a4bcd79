"""Issue 12 defects 7 and 8 against a real server (every mode): bad input that used to reach a
500, stall the event loop or be accepted gets a 400/413 (INVALID_ARGUMENT) naming the field,
and the server keeps serving everyone else."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import grpc
import pytest

from engine.sampling_params import SamplingParams
from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from router.admission import Admission
from router.request_limits import RequestLimits
from router.service import Router
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions
from tests.router.conftest import MAX_MODEL_LEN
from tests.router.server_harness import Server
from tests.router.test_router_units import FakeBackend

pytestmark = pytest.mark.timeout(300)

GOOD: dict[str, Any] = {"prompt": [5, 6, 7], "max_tokens": 2}
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _raw(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()  # ensure_ascii: a lone surrogate goes out as "\ud800"


BAD: list[tuple[str, str, bytes, int, str | None, str]] = [
    # (case, path, raw body, status, param, a word the message must hold)
    ("lone surrogate", "completions", _raw({**GOOD, "prompt": "hi \ud800"}), 400, "prompt",
     "surrogate"),
    ("lone surrogate chat", "chat/completions",
     _raw({**CHAT, "messages": [{"role": "user", "content": "a \udfff b"}]}), 400, "messages",
     "surrogate"),
    ("lone surrogate in a stop string", "completions", _raw({**GOOD, "stop": ["\ud83d"]}), 400,
     "stop", "surrogate"),
    ("[ x 100,000", "completions", b"[" * 100_000, 400, None, "nests"),
    ("deep but well-formed", "completions",
     b'{"prompt": ' + b"[" * 200 + b"5" + b"]" * 200 + b"}", 400, "prompt", "nests"),
    ("Infinity", "completions", b'{"prompt": [5], "temperature": Infinity}', 400, None,
     "Infinity"),
    ("NaN", "chat/completions",
     b'{"messages": [{"role": "user", "content": "a"}], "top_p": NaN}', 400, None, "NaN"),
    ("temperature 1e999", "completions", b'{"prompt": [5], "temperature": 1e999}', 400,
     "temperature", "finite"),
    ("max_tokens 1e9", "completions", _raw({**GOOD, "max_tokens": 1_000_000_000}), 400,
     "max_tokens", "max_model_len"),
    ("max_tokens 1e9 chat", "chat/completions", _raw({**CHAT, "max_tokens": 1_000_000_000}), 400,
     "max_tokens", "max_model_len"),
    ("max_tokens past the context", "completions",
     _raw({**GOOD, "max_tokens": MAX_MODEL_LEN - 2}), 400, "max_tokens", "max_model_len"),
    ("stop_token_ids beyond the vocabulary", "completions",
     _raw({**GOOD, "stop_token_ids": [1_000_000_000]}), 400, "stop_token_ids", "token ids"),
    ("content null", "chat/completions",
     _raw({**CHAT, "messages": [{"role": "user", "content": None}]}), 400, "messages", "content"),
    ("content missing", "chat/completions",
     _raw({**CHAT, "messages": [{"role": "system"}, {"role": "user", "content": "a"}]}), 400,
     "messages", "content"),
    ("17 stop strings", "completions", _raw({**GOOD, "stop": [f"s{i}" for i in range(17)]}), 400,
     "stop", "at most"),
    ("a long stop string", "completions", _raw({**GOOD, "stop": "x" * 1000}), 400, "stop",
     "characters"),
    ("logprobs 21", "completions", _raw({**GOOD, "logprobs": 21}), 400, "logprobs", "20"),
    ("top_logprobs 21", "chat/completions",
     _raw({**CHAT, "logprobs": True, "top_logprobs": 21}), 400, "top_logprobs", "20"),
    ("text longer than any prompt that fits", "completions",
     _raw({**GOOD, "prompt": "ab" * 100_000}), 400, "prompt", "characters"),
    ("chat longer than any prompt that fits", "chat/completions",
     _raw({**CHAT, "messages": [{"role": "user", "content": "ab" * 100_000}]}), 400, "messages",
     "characters"),
    ("seed 2**64", "completions", _raw({**GOOD, "seed": 2**64}), 400, "seed", "2**64"),
    ("body over the limit", "completions", _raw({**GOOD, "prompt": "a" * (10 << 20)}), 413, None,
     "bytes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "word"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_bad_input_gets_a_clear_error(
    server: Server, path: str, body: bytes, status: int, param: str | None, word: str
) -> None:
    r = server.post(
        f"/v1/{path}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param, err
    assert word in err["message"], err
    if param is not None:
        assert param in err["message"]


def test_a_huge_prompt_never_stalls_other_requests(server: Server) -> None:
    """A 10 MB prompt used to be tokenized on the event loop: /health took 15 s meanwhile."""
    huge = _raw({**GOOD, "prompt": "hello world " * 900_000})
    under_limit = _raw({**GOOD, "prompt": "hello world " * 300_000})  # 3.6 MB: read, refused

    async def main() -> tuple[list[int], list[float]]:
        async with server.async_http(timeout=60) as client:

            async def post(body: bytes) -> int:
                r = await client.post(
                    "/v1/completions", content=body, headers={"content-type": "application/json"}
                )
                return r.status_code

            async def health_latencies() -> list[float]:
                out = []
                for _ in range(10):
                    t0 = time.monotonic()
                    assert (await client.get("/health")).status_code == 200
                    out.append(time.monotonic() - t0)
                    await asyncio.sleep(0.05)
                return out

            big = [asyncio.create_task(post(b)) for b in (huge, under_limit, huge, under_limit)]
            latencies = await health_latencies()
            return list(await asyncio.gather(*big)), latencies

    statuses, latencies = asyncio.run(main())
    assert sorted(statuses) == [400, 400, 413, 413]
    assert max(latencies) < 5.0, latencies  # generous: this is a loaded 2-core machine
    _still_serves(server)


BAD_GRPC: list[tuple[str, pb.GenerateRequest, str]] = [
    ("temperature inf", pb.GenerateRequest(text="hi", sampling_params=pb.SamplingParams(
        temperature=float("inf"))), "temperature"),
    ("top_p nan", pb.GenerateRequest(text="hi", sampling_params=pb.SamplingParams(
        top_p=float("nan"))), "top_p"),
    ("max_tokens 1e9", pb.GenerateRequest(text="hi", sampling_params=pb.SamplingParams(
        max_tokens=1_000_000_000)), "max_tokens"),
    ("stop_token_ids beyond the vocabulary", pb.GenerateRequest(
        text="hi", sampling_params=pb.SamplingParams(stop_token_ids=[1_000_000_000])),
     "stop_token_ids"),
    ("17 stop strings", pb.GenerateRequest(text="hi", sampling_params=pb.SamplingParams(
        stop=[f"s{i}" for i in range(17)])), "stop"),
    ("text longer than any prompt that fits", pb.GenerateRequest(text="ab" * 100_000),
     "prompt"),
    ("logprobs 50", pb.GenerateRequest(text="hi", sampling_params=pb.SamplingParams(
        logprobs=50)), "logprobs"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_msg", "field"), [case[1:] for case in BAD_GRPC], ids=[case[0] for case in BAD_GRPC]
)
def test_bad_grpc_input_gets_invalid_argument(
    server: Server, request_msg: pb.GenerateRequest, field: str
) -> None:
    with server.grpc_channel() as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(request_msg, timeout=30))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert field in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(pb.TokenizeRequest(text="ab" * 100_000), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "characters" in (info.value.details() or "")


def test_grpc_takes_what_http_takes(server: Server) -> None:
    """A gRPC request as large as an HTTP body the router reads gets the same answer (here: a
    text too long for any prompt, refused by its length), not grpc's default 4 MiB cut; past
    that bound grpc refuses it unread, as HTTP answers 413."""
    over_grpc_default = "ab" * ((4 * 1024 * 1024 + 8192) // 2)  # 4 MiB + 8 KiB
    with server.grpc_channel() as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(pb.GenerateRequest(text=over_grpc_default), timeout=60))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert (info.value.details() or "").startswith("prompt is 4202496 characters")
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(pb.TokenizeRequest(text="ab" * 5_000_000), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    _still_serves(server)


def test_a_large_request_reaches_the_workers(server: Server) -> None:
    """What the router takes, its workers take: a request carrying a 4 MiB JSON schema (under
    the router's body limit) runs in every mode. The workers once kept grpc's 4 MiB default,
    refused it as RESOURCE_EXHAUSTED, and the router answered 429 to a request no retry
    could pass."""
    schema = {"type": "string", "maxLength": 4, "description": "x" * (4 * 1024 * 1024)}
    body = {"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "guided_json": schema}
    r = server.post("/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert json.loads(r.json()["choices"][0]["text"]) is not None
    _still_serves(server)


def _still_serves(server: Server) -> None:
    r = server.post(
        "/v1/completions",
        json={"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    server.wait_pool_free()


def test_limits_follow_the_model() -> None:
    small = RequestLimits.for_model(max_model_len=1024, max_token_chars=14)
    assert small.max_prompt_chars == 14 * 1024
    assert small.max_body_bytes >= 6 * small.max_prompt_chars
    big = RequestLimits.for_model(max_model_len=32768, max_token_chars=129)
    assert big.max_prompt_chars == 32768 * 129 and big.max_body_bytes > small.max_body_bytes


class _ThreadRecordingBackend(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().tokenize(text, add_special_tokens)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return [1, 2, 3]


def test_tokenization_runs_off_the_event_loop() -> None:
    backend = _ThreadRecordingBackend()
    router = Router(backend, Admission(4))

    async def main() -> None:
        await router.prepare(SamplingParams(max_tokens=2), prompt="abc")
        await router.prepare(
            SamplingParams(max_tokens=2), messages=[{"role": "user", "content": "a"}]
        )

    asyncio.run(main())
    assert backend.threads and all(t.startswith("pdserve-tokenize") for t in backend.threads)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_client_gone_before_its_body_is_read_logs_no_error(server: Server, path: str) -> None:
    """A client that closes the connection before the router has read its whole body (under
    load the router reads it late) is nobody's error: no traceback in the log, and everyone
    else is served (it used to escape as a 500 with uvicorn's "Exception in ASGI application").
    Secured: over TLS (the socket is wrapped), with the key, so the router reads the body."""
    seen = len(server.lines)
    auth = "".join(f"{k}: {v}\r\n" for k, v in server.access.headers.items())
    for _ in range(5):
        with server.connect(timeout_s=5) as sock:
            body = json.dumps(GOOD).encode()
            head = (
                f"POST {path} HTTP/1.1\r\nHost: localhost\r\n{auth}"
                f"Content-Type: application/json\r\nContent-Length: {len(body) + 100}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)  # 100 bytes short: the router waits for them
    r = server.post("/v1/completions", json=GOOD, timeout=30)
    assert r.status_code == 200, r.text
    time.sleep(0.5)  # a late log line would come after the closes
    logged = "".join(server.lines[seen:])
    assert "Traceback" not in logged and "Exception in ASGI" not in logged, logged
    server.wait_pool_free()
