"""Admission control and priority against a real server with a small queue and one running
request at a time: the excess is refused at once (429 / RESOURCE_EXHAUSTED with a retry hint),
admitted requests complete, and a lower priority value is served first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.router.server_harness import Server, start_server

pytestmark = pytest.mark.timeout(300)

MAX_QUEUE = 3
# Output tokens; the first outlasts every rejection below (2,000 steps: with the compiled CPU
# kernels 500 ran out before a loaded machine had sent the rejections).
ADMITTED = [2000, 5, 5]


@pytest.fixture(scope="module")
def busy_server(llama: Path) -> Iterator[Server]:
    s = start_server(
        llama,
        "--num-kv-blocks", "256", "--max-model-len", "2048",
        "--max-queue", str(MAX_QUEUE), "--max-num-seqs", "1", "--retry-after-s", "2",
    )  # fmt: skip
    yield s
    assert s.stop() == 0, "".join(s.lines)


def _body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": [5, 6, 7], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            **extra}  # fmt: skip


async def _wait_inflight(client: httpx.AsyncClient, n: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (await client.get("/health")).json()["num_inflight_requests"] < n:
        assert time.monotonic() < deadline, "requests were not admitted"
        await asyncio.sleep(0.02)


async def _grpc_generate(server: Server) -> grpc.aio.AioRpcError | None:
    async with server.grpc_aio_channel() as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        try:
            async for _ in stub.Generate(pb.GenerateRequest(text="hi"), timeout=30):
                pass
        except grpc.aio.AioRpcError as e:
            return e
    return None


def _check_overload(server: Server) -> None:
    async def main() -> tuple[list[httpx.Response], list[httpx.Response], Any, float]:
        async with server.async_http(timeout=120) as client:
            # One long request runs (one slot: --max-num-seqs 1); two short ones wait behind it.
            admitted = [
                asyncio.create_task(client.post("/v1/completions", json=_body(ADMITTED[0])))
            ]
            await _wait_inflight(client, 1)
            admitted += [
                asyncio.create_task(client.post("/v1/completions", json=_body(n)))
                for n in ADMITTED[1:]
            ]
            await _wait_inflight(client, MAX_QUEUE)
            start = time.monotonic()
            grpc_try = asyncio.create_task(_grpc_generate(server))
            rejected = await asyncio.gather(
                *(client.post("/v1/completions", json=_body(4)) for _ in range(4)),
                *(
                    client.post("/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": "hi"}], "stream": True})
                    for _ in range(4)
                ),
            )  # fmt: skip
            grpc_error = await grpc_try
            elapsed = time.monotonic() - start
            return await asyncio.gather(*admitted), rejected, grpc_error, elapsed

    done, rejected, grpc_error, elapsed = asyncio.run(main())
    assert elapsed < 10, f"rejections took {elapsed:.1f}s"
    for r in rejected:
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "2"
        assert r.json()["error"]["type"] == "server_busy"
    assert grpc_error is not None
    assert grpc_error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("retry-after-s", "2") in tuple(grpc_error.trailing_metadata() or ())
    for r in done:
        assert r.status_code == 200, r.text
    assert [r.json()["usage"]["completion_tokens"] for r in done] == ADMITTED
    health = server.wait_pool_free()
    assert health["num_rejected_requests"] >= 9
    r = server.post("/v1/completions", json=_body(2), timeout=60)
    assert r.status_code == 200


def _check_priority(server: Server) -> None:
    """One running slot: a request queued later with a lower priority value runs first."""

    async def main() -> dict[str, float]:
        finished: dict[str, float] = {}
        first_token: dict[str, float] = {}

        async def run(client: httpx.AsyncClient, name: str, body: dict[str, Any]) -> None:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and name not in first_token:
                        first_token[name] = time.monotonic()
            finished[name] = time.monotonic()

        async with server.async_http(timeout=120) as client:
            # Nearly max_model_len (2048): it must outlast queueing two more requests.
            head = asyncio.create_task(run(client, "head", _body(2000, stream=True)))
            while "head" not in first_token:
                await asyncio.sleep(0.01)
            low = asyncio.create_task(run(client, "low", _body(5, stream=True, priority=10)))
            await _wait_inflight(client, 2)
            high = asyncio.create_task(run(client, "high", _body(20, stream=True, priority=-10)))
            await _wait_inflight(client, 3)
            assert "head" not in finished, "the running request ended too early for this test"
            await asyncio.gather(head, low, high)
        return {"high_first": first_token["high"], "low_first": first_token["low"]}

    t = asyncio.run(main())
    # The engine runs "high" whole (20 steps) before "low" starts: a margin of 20 steps.
    assert t["high_first"] < t["low_first"]
    server.wait_pool_free()


def test_admission_and_priority(busy_server: Server) -> None:
    # One test, not two: xdist would otherwise start this server in both workers.
    _check_overload(busy_server)
    _check_priority(busy_server)
