"""Clients the fault tests drive the router with: gRPC and OpenAI HTTP, streaming, each call
bounded in time, each outcome recorded as plain data (tokens, finish reason or the error)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 120.0  # a bound on every call: a test never hangs on one


@dataclass
class Outcome:
    """What one client saw."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # gRPC status name / HTTP error body's type, with the message
    status: int | None = None  # HTTP status
    done: bool = False  # HTTP stream: "[DONE]" arrived
    cancelled: bool = False  # the client gave up on purpose
    ended_at: float = 0.0  # time.monotonic() when the client had its answer


async def grpc_generate(
    stub: pb_grpc.GenerationServiceStub,
    prompt_ids: list[int],
    max_tokens: int,
    timeout_s: float = CALL_TIMEOUT_S,
    cancel_after: int | None = None,
) -> Outcome:
    """Greedy, EOS ignored. ``cancel_after``: cancel the call after that many messages."""
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=prompt_ids),
        sampling_params=pb.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
    )
    out = Outcome()
    call = stub.Generate(request, timeout=timeout_s)
    try:
        n = 0
        async for msg in call:
            out.token_ids.extend(msg.token_ids)
            out.text += msg.text
            n += 1
            if msg.finished:
                out.finish_reason = msg.finish_reason
            if cancel_after is not None and n >= cancel_after:
                call.cancel()
                out.cancelled = True
                break
    except grpc.aio.AioRpcError as e:
        out.error = f"{e.code().name}: {e.details()}"
    out.ended_at = time.monotonic()
    return out


async def http_stream(
    client: httpx.AsyncClient,
    url: str,
    prompt_ids: list[int],
    max_tokens: int,
    cancel_after: int | None = None,
    **extra: Any,
) -> Outcome:
    """A streamed completion; ``cancel_after``: close the connection after that many events."""
    body = {
        "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, **extra,
    }  # fmt: skip
    out = Outcome()
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.error = (await r.aread()).decode()
            return out
        n = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                out.done = True
                break
            event = json.loads(data)
            if "error" in event:
                out.error = f"{event['error']['type']}: {event['error']['message']}"
                continue
            choice = event["choices"][0]
            out.text += choice["text"]
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
            n += 1
            if cancel_after is not None and n >= cancel_after:
                out.cancelled = True
                break
    out.ended_at = time.monotonic()
    return out


async def http_complete(
    client: httpx.AsyncClient, url: str, prompt_ids: list[int], max_tokens: int, **extra: Any
) -> Outcome:
    """A non-streaming completion."""
    body = {
        "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, **extra,
    }  # fmt: skip
    r = await client.post(f"{url}/v1/completions", json=body)
    out = Outcome(status=r.status_code)
    if r.status_code != 200:
        out.error = r.text
        return out
    choice = r.json()["choices"][0]
    out.text, out.finish_reason = choice["text"], choice["finish_reason"]
    return out
