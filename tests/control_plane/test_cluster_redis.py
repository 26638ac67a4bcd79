"""The whole control plane for real: ``pdserve serve --prefill-workers 2 --decode-workers 2
--redis-url`` (workers register in a real redis-server), plus a second, standalone
``pdserve router --redis-url`` with no worker list. Both routers serve HF-exact greedy tokens
through every pool; requests keep succeeding while Redis is stopped (SIGSTOP) and after it
comes back; every pool is free at the end."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import pytest

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import random_prompts
from tests.hf_oracle import hf_greedy
from tests.redis_harness import RedisServer
from tests.router.server_harness import Server, launch, start_server


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


async def _complete(address: str, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens over the router's gRPC API (it streams token ids)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        req = pb.GenerateRequest(
            sampling_params=pb.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        )
        req.token_ids.ids.extend(prompt)
        return [
            t for msg in [m async for m in stub.Generate(req, timeout=120)] for t in msg.token_ids
        ]


def _metric(server: Server, name: str) -> dict[str, float]:
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _wait_routable(server: Server, decode: int, prefill: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        healthy = _metric(server, "pdserve_router_healthy_workers")
        by_pool = {k.split('pool="')[1].split('"')[0]: v for k, v in healthy.items()}
        if by_pool.get("decode") == decode and by_pool.get("prefill") == prefill:
            return
        assert time.monotonic() < deadline, healthy
        time.sleep(0.2)


def test_two_routers_over_redis_are_hf_exact_and_survive_a_redis_stall(
    llama: Path, redis: RedisServer
) -> None:
    flags = ["--redis-url", redis.url, "--cluster-name", "it"]
    serve = start_server(
        llama, "--prefill-workers", "2", "--decode-workers", "2", *flags, colocated=False
    )
    second = None
    try:
        second = launch(["router", "--model", str(llama), *flags], False)
        for router in (serve, second):
            _wait_routable(router, decode=2, prefill=2)
        prompts = random_prompts(8, 200, 20, 70, seed=41)
        expected = [hf_greedy(llama, p, 6) for p in prompts]

        async def burst() -> list[list[int]]:
            urls = [serve.grpc_address, second.grpc_address]  # type: ignore[union-attr]
            return await asyncio.gather(
                *(_complete(urls[i % 2], p, 6) for i, p in enumerate(prompts))
            )

        assert asyncio.run(burst()) == expected
        # The burst spread over both decode workers (the routers count their own sends).
        decisions = _metric(serve, "pdserve_router_routing_decisions_total")
        assert sum(decisions.values()) >= 4, decisions

        # Redis stops answering: both routers keep routing on what they know.
        redis.pause()
        try:
            assert asyncio.run(burst()) == expected
        finally:
            redis.resume()
        assert asyncio.run(burst()) == expected
        serve.wait_pool_free(30)
        second.wait_pool_free(30)
    finally:
        if second is not None:
            second.stop()
        serve.stop()
