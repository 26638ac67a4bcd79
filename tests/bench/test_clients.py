"""The OpenAI client on scripted SSE streams (httpx.MockTransport): what it sends, how it
stamps chunks, where token counts come from, cancels and failures. And the server launcher."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdserve.bench.openai_client import OpenAIClient
from pdserve.bench.records import CANCELLED, FAILED, OK
from pdserve.bench.server_launch import is_ready, launched_server
from pdserve.bench.workload import BenchRequest
from tests.sockets import free_port


def sse(events: list[dict[str, Any] | str]) -> list[bytes]:
    return [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events]


def completion_stream(texts: list[str], usage: dict[str, Any] | None) -> list[bytes]:
    events: list[dict[str, Any] | str] = [
        {"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in texts
    ]
    events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    if usage is not None:
        events.append({"choices": [], "usage": usage})
    return sse([*events, "[DONE]"])


def client_for(
    chunks: list[bytes], seen: list[dict[str, Any]], status: int = 200, **kw: Any
) -> OpenAIClient:
    async def body() -> AsyncIterator[bytes]:
        for c in chunks:
            await asyncio.sleep(0.001)
            yield c

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m1"}]})
        seen.append({"path": request.url.path, **json.loads(request.content)})
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "busy"}})
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    return OpenAIClient("http://test/v1", transport=httpx.MockTransport(handler), **kw)


def send(client: OpenAIClient, request: BenchRequest) -> Any:
    async def go() -> Any:
        try:
            return await client.send(request, time.perf_counter())
        finally:
            await client.aclose()

    return asyncio.run(go())


REQ = BenchRequest(0, (11, 12, 13), None, 5)
USAGE = {"prompt_tokens": 3, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2}}


def test_completions_body_and_timings() -> None:
    seen: list[dict[str, Any]] = []
    # 4 content chunks for 5 tokens (a server may coalesce): counts come from usage.
    r = send(client_for(completion_stream(["a", "b", "cd", "e"], USAGE), seen), REQ)
    assert seen == [
        {
            "path": "/v1/completions",
            "model": "m1",
            "prompt": [11, 12, 13],
            "max_tokens": 5,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    ]
    assert r.status == OK and r.error is None and r.finish_reason == "length"
    assert (r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens) == (3, 5, 2)
    assert r.usage_reported and r.num_chunks == 4 and len(r.itl_s) == 3
    assert r.ttft_s is not None and r.e2e_s is not None
    assert 0 < r.ttft_s <= r.ttft_s + sum(r.itl_s) <= r.e2e_s
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 4)


def test_chat_body_text_prompt_extra_body_and_no_usage() -> None:
    seen: list[dict[str, Any]] = []
    events = sse(
        [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"index": 0, "delta": {"content": "x"}}]},
            {"choices": [{"index": 0, "delta": {"content": "y"}, "finish_reason": "stop"}]},
            "[DONE]",
        ]
    )
    client = client_for(
        events, seen, api="chat", model="chosen", ignore_eos=False, extra_body={"top_k": 3}
    )
    r = send(client, REQ)
    body = seen[0]
    assert body["path"] == "/v1/chat/completions" and body["model"] == "chosen"
    assert (
        body["messages"][0]["role"] == "user" and len(body["messages"][0]["content"].split()) == 3
    )
    assert "ignore_eos" not in body and body["top_k"] == 3
    assert r.status == OK and r.num_chunks == 2  # the role-only chunk is not a token
    assert not r.usage_reported and r.num_output_tokens == 2  # fallback: chunks
    assert r.num_prompt_tokens == 3 and r.finish_reason == "stop"


def test_text_prompt_format() -> None:
    seen: list[dict[str, Any]] = []
    send(client_for(completion_stream(["a"], USAGE), seen, prompt_format="text"), REQ)
    assert isinstance(seen[0]["prompt"], str)


def test_cancel_after_tokens_closes_the_stream() -> None:
    seen: list[dict[str, Any]] = []
    req = BenchRequest(1, (1, 2), None, 8, cancel_after_tokens=2)
    r = send(client_for(completion_stream(list("abcdefgh"), USAGE), seen), req)
    assert r.status == CANCELLED and r.num_chunks == 2 and r.num_output_tokens == 2
    assert r.e2e_s is not None and not r.usage_reported


@pytest.mark.parametrize(
    "chunks, status, match",
    [
        ([], 429, "HTTP 429"),
        (sse([{"error": {"message": "boom"}}, "[DONE]"]), 200, "stream error"),
        ([b"data: {not json\n\n"], 200, "JSONDecodeError"),
        (completion_stream(["a"], USAGE)[:1], 200, "without a finish_reason or [DONE]"),
    ],
)
def test_failures_are_records(chunks: list[bytes], status: int, match: str) -> None:
    r = send(client_for(chunks, [], status=status), REQ)
    assert r.status == FAILED and r.error is not None and match in r.error


def test_a_finished_stream_without_done_is_complete() -> None:
    r = send(client_for(completion_stream(["a", "b"], USAGE)[:-1], []), REQ)
    assert r.status == OK and r.finish_reason == "length" and r.usage_reported


def test_unreachable_server_is_a_failed_record() -> None:
    client = OpenAIClient("http://127.0.0.1:9/v1", model="m", timeout_s=5)
    r = send(client, REQ)
    assert r.status == FAILED and "Connect" in (r.error or "")


def test_launched_server_waits_for_ready_and_stops_it(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text("{}")
    url = f"http://127.0.0.1:{port}/v1"
    cmd = f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path}"
    log = tmp_path / "server.log"
    with launched_server(cmd, url, timeout_s=30, log_path=log):
        assert is_ready(url)
    assert not is_ready(url)
    with pytest.raises(RuntimeError, match="exited"):
        with launched_server(f"{sys.executable} -c 'raise SystemExit(3)'", url, timeout_s=30):
            pass
    with launched_server(None, url, timeout_s=1):  # no command: nothing to start
        assert not is_ready(url)
