"""Defects 1 and 2 of issue 12: an abort storm leaks no block, and one request's cancel never
breaks another's.

Streaming requests over HTTP and gRPC, a bounded number in flight, prompts of 5-1,500 tokens,
about 40% given up at a random moment (task cancelled mid-call: the HTTP connection closes or
the gRPC call is cancelled; an HTTP client read timeout; a gRPC deadline; the request's own
HTTP ``timeout``). Afterwards every request that was not given up has its full output, equal to
HF's greedy tokens; no HTTP stream ended without ``[DONE]``; every pool is fully free with its
invariants holding; and no process logged a broken callback or task.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from kv_transfer import is_ucx_available
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.engine.engine_utils import random_prompts
from tests.faults.clients import Outcome, grpc_generate, http_stream
from tests.faults.cluster import start_cluster
from tests.hf_oracle import hf_greedy
from tests.sockets import is_loopback, listening_addresses

NUM_REQUESTS = 120
MAX_IN_FLIGHT = 24
CANCEL_SHARE = 0.4
# Kinds of giving up. "task": the client task is cancelled at a random moment (gRPC: the call
# is cancelled; HTTP: the connection closes); the others are deadlines of each kind.
KINDS = ("task", "client_timeout", "grpc_deadline", "request_timeout")


@dataclass(frozen=True)
class Plan:
    index: int
    api: str  # "grpc" | "http"
    prompt: list[int]
    max_tokens: int
    give_up: str | None  # one of KINDS, or None: this request must complete
    after_s: float  # when it gives up


def _plans(seed: int) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for i in range(NUM_REQUESTS):
        # Log-uniform prompt lengths: mostly short, some long.
        length = round(5 * (1500 / 5) ** rng.random())
        prompt = random_prompts(1, 800, length, length, seed=seed * 1000 + i)[0]
        give_up = rng.choice(KINDS) if rng.random() < CANCEL_SHARE else None
        api = (
            "grpc"
            if give_up == "grpc_deadline"
            else "http"
            if give_up
            else rng.choice(("grpc", "http"))
        )
        if give_up in ("client_timeout", "request_timeout"):
            api = "http"
        plans.append(Plan(i, api, prompt, rng.randint(5, 200), give_up, rng.uniform(0.0, 1.5)))
    return plans


async def _one(
    plan: Plan, stub: pb_grpc.GenerationServiceStub, client: httpx.AsyncClient, url: str
) -> Outcome:
    if plan.give_up == "grpc_deadline":
        return await grpc_generate(stub, plan.prompt, plan.max_tokens, timeout_s=plan.after_s)
    if plan.give_up == "request_timeout":
        return await http_stream(
            client, url, plan.prompt, plan.max_tokens, timeout=max(plan.after_s, 0.01)
        )
    if plan.give_up == "client_timeout":
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=plan.after_s)) as c:
                return await http_stream(c, url, plan.prompt, plan.max_tokens)
        except httpx.ReadTimeout:
            return Outcome(cancelled=True)
    if plan.api == "grpc":
        call = grpc_generate(stub, plan.prompt, plan.max_tokens)
    else:
        call = http_stream(client, url, plan.prompt, plan.max_tokens)
    if plan.give_up != "task":
        return await call
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=plan.after_s)
    if done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return Outcome(cancelled=True)


def _storm(grpc_address: str, url: str, plans: list[Plan]) -> list[Outcome]:
    async def run() -> list[Outcome]:
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)
        async with (
            grpc.aio.insecure_channel(grpc_address) as channel,
            httpx.AsyncClient(timeout=120) as client,
        ):
            stub = pb_grpc.GenerationServiceStub(channel)

            async def gated(plan: Plan) -> Outcome:
                async with gate:
                    return await _one(plan, stub, client, url)

            return await asyncio.gather(*(gated(p) for p in plans))

    return asyncio.run(run())


BROKEN = (
    "Traceback",
    "Exception in callback",
    "Task was destroyed but it is pending",
    "ASGI callable returned without completing response",
)

TRANSPORTS = [
    "tcp",
    pytest.param(
        "ucx", marks=pytest.mark.skipif(not is_ucx_available(), reason="ucxx not installed")
    ),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_abort_storm_leaks_nothing_and_breaks_no_other_request(llama: Path, transport: str) -> None:
    plans = _plans(seed=12)
    with start_cluster(
        llama,
        num_decode=2,
        decode_args=["--kv-transport", transport],
        router_args=["--local-prefill-max-tokens", "16"],
        num_kv_blocks=2048,
    ) as cluster:
        outcomes = _storm(cluster.router.grpc_address, cluster.url, plans)
        cluster.wait_pools_free()
        logs = cluster.logs()
        # Defect 9: every listener of every process, the KV transports' too, is on loopback.
        for proc in (cluster.router.process, *(w.proc for w in cluster.workers)):
            addresses = listening_addresses(proc.pid)
            assert addresses and all(is_loopback(a) for a in addresses), addresses
    problems = []
    for plan, out in zip(plans, outcomes, strict=True):
        if plan.give_up is None:
            complete = out.error is None and out.finish_reason == "length"
            if plan.api == "grpc":
                complete = complete and len(out.token_ids) == plan.max_tokens
            else:
                complete = complete and out.done
            if not complete:
                problems.append(f"request {plan.index} ({plan.api}) incomplete: {out}")
        elif plan.api == "http" and not out.cancelled and not out.done:
            problems.append(f"request {plan.index}: HTTP stream cut without [DONE]: {out}")
    assert not problems, "\n".join(problems)
    # Completed outputs are the uninterrupted greedy run's (a sample: HF is slow on long ones).
    completed = [
        (p, o)
        for p, o in zip(plans, outcomes, strict=True)
        if p.api == "grpc" and p.give_up is None and len(p.prompt) <= 600
    ]
    assert len(completed) >= 8
    for plan, out in completed[:8]:
        assert out.token_ids == hf_greedy(llama, plan.prompt, plan.max_tokens), plan.index
    broken = [line for line in logs.splitlines() if any(b in line for b in BROKEN)]
    assert not broken, "\n".join(broken[:10])
