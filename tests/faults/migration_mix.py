"""The request mix the migration tests run through a router, uninterrupted and then with a
fault: greedy, seeded, seeded with min_tokens and penalties, a long stop string that holds text
back across the switch, logprobs over SSE; each client's every gRPC delta and SSE chunk is
recorded (``Seen``) so a run can be compared with the uninterrupted one token for token."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.faults.cluster import Cluster
from tests.hf_oracle import hf_greedy

MAX_TOKENS = 1200
CALL_TIMEOUT_S = 240.0


def prompt_of(seed: int, n: int = 40) -> list[int]:
    return [3 + (seed * 37 + i * 11) % 190 for i in range(n)]


@dataclass(frozen=True)
class Req:
    name: str
    prompt: list[int]
    params: dict[str, Any]
    http: bool = False  # an SSE completion with logprobs (else a gRPC stream)


@dataclass
class Seen:
    """Everything one client received, delta by delta."""

    deltas: list[list[int]] = field(default_factory=list)  # gRPC token ids per message
    pieces: list[str] = field(default_factory=list)  # SSE: one token string per token
    text: str = ""
    finish_reason: str | None = None
    usage: tuple[int, int] | None = None  # (prompt, completion)
    error: str | None = None

    @property
    def token_ids(self) -> list[int]:
        return [t for d in self.deltas for t in d]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + len(self.pieces)

    def result(self) -> tuple[Any, ...]:
        return (self.token_ids, self.pieces, self.text, self.finish_reason, self.usage)


def mix(stop: str | None = None, base: int = 0) -> list[Req]:
    """The mix; ``base`` shifts every prompt (prompts no worker has cached yet)."""
    greedy = dict(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    seeded = dict(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=42, ignore_eos=True)
    reqs = [
        Req("greedy-a", prompt_of(base + 1), greedy),
        Req("greedy-b", prompt_of(base + 2, 60), greedy),
        Req("seeded", prompt_of(base + 3), seeded),
        Req(
            "seeded-min-tokens-penalties",
            prompt_of(base + 4),
            dict(
                max_tokens=MAX_TOKENS,
                min_tokens=MAX_TOKENS - 20,
                temperature=1.0,
                seed=7,
                presence_penalty=0.5,
                frequency_penalty=0.3,
                repetition_penalty=1.1,
            ),
        ),
        Req("sse-logprobs", prompt_of(base + 5), dict(greedy, logprobs=1), http=True),
    ]
    if stop is not None:
        reqs.append(Req("stop", prompt_of(1), dict(greedy, stop=[stop])))
    return reqs


async def grpc_stream(stub: pb_grpc.GenerationServiceStub, req: Req, seen: Seen) -> None:
    p = req.params
    params = pb.SamplingParams(
        max_tokens=p["max_tokens"], temperature=p["temperature"],
        ignore_eos=p.get("ignore_eos", False), min_tokens=p.get("min_tokens", 0),
        top_p=p.get("top_p", 1.0), stop=p.get("stop", []),
        presence_penalty=p.get("presence_penalty", 0.0),
        frequency_penalty=p.get("frequency_penalty", 0.0),
        repetition_penalty=p.get("repetition_penalty", 1.0),
    )  # fmt: skip
    if "seed" in p:
        params.seed = p["seed"]
    call = stub.Generate(
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=req.prompt), sampling_params=params),
        timeout=CALL_TIMEOUT_S,
    )
    try:
        async for msg in call:
            seen.deltas.append(list(msg.token_ids))
            seen.text += msg.text
            if msg.finished:
                seen.finish_reason = msg.finish_reason
                seen.usage = (msg.usage.prompt_tokens, msg.usage.completion_tokens)
    except grpc.aio.AioRpcError as e:
        seen.error = f"{e.code().name}: {e.details()}"


async def sse_stream(client: httpx.AsyncClient, url: str, req: Req, seen: Seen) -> None:
    body = {"prompt": req.prompt, "stream": True, "stream_options": {"include_usage": True},
            **req.params}  # fmt: skip
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                seen.error = f"{event['error']['type']}: {event['error']['message']}"
                continue
            if event.get("usage"):
                u = event["usage"]
                seen.usage = (u["prompt_tokens"], u["completion_tokens"])
            for choice in event.get("choices", []):
                seen.text += choice["text"]
                seen.pieces += (choice.get("logprobs") or {}).get("tokens", [])
                if choice.get("finish_reason"):
                    seen.finish_reason = choice["finish_reason"]


def _stuck(seen: dict[str, Seen], cluster: Cluster) -> str:
    """A failed wait for the fault's moment: each stream's tokens, finish and error, and every
    process's log (where the stream that got nothing sat)."""
    state = {k: (s.num_tokens, s.finish_reason, s.error) for k, s in seen.items()}
    return f"{state}\n{cluster.logs()}"


async def run_mix(
    cluster: Cluster,
    reqs: list[Req],
    fault: Callable[[], None] | None = None,
    after_tokens: int = 20,
    stagger_s: float = 0.05,
) -> dict[str, Seen]:
    """Run ``reqs`` side by side (staggered, so the router spreads them over both decode
    workers); once every stream has ``after_tokens`` tokens (0: at once), inject ``fault``."""
    seen = {r.name: Seen() for r in reqs}
    async with (
        httpx.AsyncClient(timeout=CALL_TIMEOUT_S) as client,
        grpc.aio.insecure_channel(cluster.router.grpc_address) as channel,
    ):
        stub = pb_grpc.GenerationServiceStub(channel)
        tasks = []
        for r in reqs:
            run = (
                sse_stream(client, cluster.url, r, seen[r.name])
                if r.http
                else grpc_stream(stub, r, seen[r.name])
            )
            tasks.append(asyncio.ensure_future(run))
            await asyncio.sleep(stagger_s)
        if fault is not None:
            # Wait until every stream still running has after_tokens. On a loaded machine one
            # stream can finish before another has its first few (a CI run saw greedy-b end
            # while two streams had 8 tokens): a cleanly finished one is no reason to wait, a
            # failed one fails here; the callers' checks say whether the fault hit a stream.
            deadline = time.monotonic() + 60
            streams = list(zip(tasks, seen.values(), strict=True))
            while any(not t.done() and s.num_tokens < after_tokens for t, s in streams):
                assert time.monotonic() < deadline, _stuck(seen, cluster)
                failed = [t for t in tasks if t.done() and t.exception() is not None]
                assert not failed, (failed[0].exception(), _stuck(seen, cluster))
                await asyncio.sleep(0.02)
            await asyncio.to_thread(fault)
        await asyncio.wait_for(asyncio.gather(*tasks), CALL_TIMEOUT_S + 30)
    return seen


def migrations(cluster: Cluster) -> dict[tuple[str, str], float]:
    return {
        (s.labels["phase"], s.labels["reason"]): s.value
        for s in cluster.router_samples("pdserve_migrations_total")
        if s.value
    }


def uninterrupted(cluster: Cluster, model: Path) -> tuple[dict[str, Seen], str]:
    """The uninterrupted run (greedy checked against HF) and a long stop string from it."""
    base = asyncio.run(run_mix(cluster, mix(), stagger_s=0.05))
    for name, s in base.items():
        assert s.error is None and s.finish_reason == "length", (name, s)
        assert s.num_tokens == MAX_TOKENS and s.usage is not None and s.usage[1] == MAX_TOKENS
    prompt = mix()[0].prompt
    assert base["greedy-a"].token_ids == hf_greedy(model, prompt, MAX_TOKENS)
    assert base["greedy-b"].token_ids == hf_greedy(model, mix()[1].prompt, MAX_TOKENS)
    # A 12-character stop string first seen late in greedy-a's text: at any switch before it,
    # 11 characters are held back on the failing worker and must come out of the new one.
    text = base["greedy-a"].text
    at = len(text) * 3 // 4
    stop = next(
        text[i : i + 12] for i in range(at, len(text) - 12) if text.find(text[i : i + 12]) == i
    )
    stopped = asyncio.run(run_mix(cluster, [mix(stop)[-1]]))["stop"]
    assert stopped.finish_reason == "stop" and stop not in stopped.text, stopped
    base["stop"] = stopped
    return base, stop


def assert_same(got: dict[str, Seen], expected: dict[str, Seen], cluster: Cluster) -> None:
    for name, s in got.items():
        if s.error is not None or s.result() != expected[name].result():
            print(cluster.logs(), file=sys.stderr)  # the processes' side of the story
        assert s.error is None, (name, s.error)
        assert s.result() == expected[name].result(), name
