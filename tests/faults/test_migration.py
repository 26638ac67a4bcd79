"""Issue 15: request migration. A decode worker that dies (kill -9), stalls (SIGSTOP) or drains
(SIGTERM), and a prefill worker that dies mid-prefill, cost their clients nothing: every stream
continues on another worker, and what the client receives — every gRPC delta, every SSE chunk
— is exactly the uninterrupted run's, token for token (greedy: HF's), with exact usage counts.
When no worker can take a request over, the client gets UNAVAILABLE naming why.

Real processes on loopback: 2 prefill + 2 decode workers and the router. Each scenario runs a
mix (greedy, seeded, seeded with min_tokens and penalties, a long stop string that holds text
back across the switch, logprobs over SSE) uninterrupted first, then again with the fault.
"""

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
from prometheus_client.parser import text_string_to_metric_families

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.faults.cluster import Cluster, start_cluster
from tests.hf_oracle import hf_greedy

AVOID_FAILED_S = 5.0  # router.disaggregated_backend: a worker that lost a request is avoided

STALL_S = 6.0  # decode heartbeats every ~1 s; generous for a loaded 2-core machine
MAX_TOKENS = 1200
CALL_TIMEOUT_S = 240.0


def _prompt(seed: int, n: int = 40) -> list[int]:
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


def _requests(stop: str | None = None, base: int = 0) -> list[Req]:
    """The mix; ``base`` shifts every prompt (prompts no worker has cached yet)."""
    greedy = dict(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    seeded = dict(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=42, ignore_eos=True)
    reqs = [
        Req("greedy-a", _prompt(base + 1), greedy),
        Req("greedy-b", _prompt(base + 2, 60), greedy),
        Req("seeded", _prompt(base + 3), seeded),
        Req(
            "seeded-min-tokens-penalties",
            _prompt(base + 4),
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
        Req("sse-logprobs", _prompt(base + 5), dict(greedy, logprobs=1), http=True),
    ]
    if stop is not None:
        reqs.append(Req("stop", _prompt(1), dict(greedy, stop=[stop])))
    return reqs


async def _grpc(stub: pb_grpc.GenerationServiceStub, req: Req, seen: Seen) -> None:
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


async def _sse(client: httpx.AsyncClient, url: str, req: Req, seen: Seen) -> None:
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


async def _run(
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
                _sse(client, cluster.url, r, seen[r.name])
                if r.http
                else _grpc(stub, r, seen[r.name])
            )
            tasks.append(asyncio.ensure_future(run))
            await asyncio.sleep(stagger_s)
        if fault is not None:
            deadline = time.monotonic() + 60
            while any(s.num_tokens < after_tokens for s in seen.values()):
                assert time.monotonic() < deadline, {k: s.num_tokens for k, s in seen.items()}
                assert not any(t.done() for t in tasks), seen
                await asyncio.sleep(0.02)
            await asyncio.to_thread(fault)
        await asyncio.wait_for(asyncio.gather(*tasks), CALL_TIMEOUT_S + 30)
    return seen


def _migrations(cluster: Cluster) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{cluster.url}/metrics", timeout=10).text
    return {
        (s.labels["phase"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "pdserve_migrations_total" and s.value
    }


def _expected(cluster: Cluster, model: Path) -> tuple[dict[str, Seen], str]:
    """The uninterrupted run (greedy checked against HF) and a long stop string from it."""
    base = asyncio.run(_run(cluster, _requests(), stagger_s=0.05))
    for name, s in base.items():
        assert s.error is None and s.finish_reason == "length", (name, s)
        assert s.num_tokens == MAX_TOKENS and s.usage is not None and s.usage[1] == MAX_TOKENS
    prompt = _requests()[0].prompt
    assert base["greedy-a"].token_ids == hf_greedy(model, prompt, MAX_TOKENS)
    assert base["greedy-b"].token_ids == hf_greedy(model, _requests()[1].prompt, MAX_TOKENS)
    # A 12-character stop string first seen late in greedy-a's text: at any switch before it,
    # 11 characters are held back on the failing worker and must come out of the new one.
    text = base["greedy-a"].text
    at = len(text) * 3 // 4
    stop = next(
        text[i : i + 12] for i in range(at, len(text) - 12) if text.find(text[i : i + 12]) == i
    )
    stopped = asyncio.run(_run(cluster, [_requests(stop)[-1]]))["stop"]
    assert stopped.finish_reason == "stop" and stop not in stopped.text, stopped
    base["stop"] = stopped
    return base, stop


def _assert_same(got: dict[str, Seen], expected: dict[str, Seen], cluster: Cluster) -> None:
    for name, s in got.items():
        if s.error is not None or s.result() != expected[name].result():
            print(cluster.logs(), file=sys.stderr)  # the processes' side of the story
        assert s.error is None, (name, s.error)
        assert s.result() == expected[name].result(), name


def test_decode_stall_and_drain_and_prefill_death_migrate_every_stream(llama: Path) -> None:
    with start_cluster(
        llama,
        num_prefill=2,
        num_decode=2,
        # Every prompt prefills on a prefill worker, cached on decode or not (the uninterrupted
        # run caches them there; a local prefill would never reach the killed prefill worker).
        router_args=[
            *("--stall-timeout-s", str(STALL_S)),
            *("--local-prefill-max-tokens", "0", "--local-prefill-hit-ratio", "2"),
        ],
        decode_args=["--drain-migrate-after-s", "1", "--shutdown-grace-s", "30"],
        num_kv_blocks=1024,
    ) as cluster:
        expected, stop = _expected(cluster, llama)
        reqs = _requests(stop)

        # SIGSTOP decode 0 mid-decode: its streams stall, then continue on decode 1.
        try:
            got = asyncio.run(_run(cluster, reqs, cluster.decode[0].pause))
        finally:
            cluster.decode[0].resume()
        _assert_same(got, expected, cluster)
        assert _migrations(cluster).get(("decode", "stall"), 0) >= 1, _migrations(cluster)
        cluster.wait_pools_free()

        # SIGTERM decode 1 mid-decode: after --drain-migrate-after-s its streams move to
        # decode 0 (back in routing once it answers again and the router's avoidance of a
        # worker that lost a request has passed).
        time.sleep(AVOID_FAILED_S + 1)
        deadline = time.monotonic() + 30
        while cluster.router.health()["load"]["num_blocks"] < sum(
            w.load().num_blocks for w in cluster.workers
        ):
            assert time.monotonic() < deadline, "decode 0 did not rejoin routing"
            time.sleep(0.2)
        before = _migrations(cluster).get(("decode", "drain"), 0)
        got = asyncio.run(_run(cluster, reqs, lambda: cluster.decode[1].proc.terminate()))
        _assert_same(got, expected, cluster)
        assert _migrations(cluster).get(("decode", "drain"), 0) > before, _migrations(cluster)
        assert cluster.decode[1].proc.wait(30) == 0
        cluster.wait_pools_free()

        # kill -9 a prefill worker while it holds prefills (stopped first, so they wait there).
        def kill_prefill() -> None:
            cluster.prefill[0].kill()

        cluster.prefill[0].pause()
        got = asyncio.run(_run(cluster, reqs, kill_prefill, after_tokens=0, stagger_s=0.05))
        _assert_same(got, expected, cluster)
        counts = _migrations(cluster)
        assert sum(n for (phase, _), n in counts.items() if phase == "prefill") >= 1, counts
        cluster.wait_pools_free()


def test_decode_death_migrates_and_no_worker_left_is_a_clear_error(llama: Path) -> None:
    with start_cluster(
        llama,
        num_prefill=2,
        num_decode=2,
        router_args=["--stall-timeout-s", str(STALL_S)],
        num_kv_blocks=1024,
    ) as cluster:
        expected, stop = _expected(cluster, llama)
        reqs = _requests(stop)
        got = asyncio.run(_run(cluster, reqs, cluster.decode[0].kill))
        _assert_same(got, expected, cluster)
        assert _migrations(cluster).get(("decode", "worker_lost"), 0) >= 1, _migrations(cluster)
        cluster.wait_pools_free()

        # The last decode worker stalls: nowhere to migrate, a clear error for every stream.
        try:
            got = asyncio.run(_run(cluster, reqs[:2], cluster.decode[1].pause, after_tokens=10))
        finally:
            cluster.decode[1].resume()
        for name, s in got.items():
            assert s.error is not None and s.error.startswith("UNAVAILABLE"), (name, s)
            assert "stalled" in s.error and "migrating the request failed" in s.error, s.error
            assert "no decode worker is available" in s.error, s.error
        cluster.wait_pools_free()


def test_a_stopped_or_terminated_prefill_worker_costs_nothing(llama: Path) -> None:
    """Prompts no worker has cached, all prefilled remotely (--local-prefill-max-tokens 0):
    those on a SIGSTOPped prefill worker move to the other once decode's lease on their
    blocks expires unrenewed (the failure is the prefill worker's, so it is the one avoided);
    those queued on a prefill worker that gets SIGTERM with no grace move too (or finish
    first). Both runs equal the uninterrupted one, run afterwards (greedy: HF's)."""
    with start_cluster(
        llama,
        num_prefill=2,
        num_decode=2,
        router_args=["--stall-timeout-s", str(STALL_S), "--local-prefill-max-tokens", "0"],
        prefill_args=["--shutdown-grace-s", "0"],
        decode_args=["--kv-lease-s", "3"],
        num_kv_blocks=1024,
    ) as cluster:
        stopped, reqs = cluster.prefill[0], _requests(base=10)
        stopped.pause()
        try:
            got_stop = asyncio.run(_run(cluster, reqs))
        finally:
            stopped.resume()
        counts = _migrations(cluster)
        assert counts.get(("prefill", "stall"), 0) >= 1, counts
        cluster.wait_pools_free()

        def terminate_while_queued() -> None:
            time.sleep(1.5)  # the Prefill calls have reached the stopped worker's socket
            stopped.proc.terminate()
            stopped.resume()

        time.sleep(AVOID_FAILED_S + 1)  # prefill 0 is routed to again
        stopped.pause()
        got_term = asyncio.run(_run(cluster, reqs, terminate_while_queued, after_tokens=0))
        assert stopped.proc.wait(30) == 0
        # Its queued prefills are refused with "shutting down" and migrate, or (a tiny
        # model's prefill takes milliseconds) finish before the drain looks: either way the
        # streams must equal the uninterrupted run, checked below.
        print("migrations after the SIGTERM run:", _migrations(cluster))
        cluster.wait_pools_free()

        expected = asyncio.run(_run(cluster, reqs))
        for name, s in expected.items():
            assert s.error is None and s.finish_reason == "length", (name, s)
        assert expected["greedy-a"].token_ids == hf_greedy(llama, reqs[0].prompt, MAX_TOKENS)
        _assert_same(got_stop, expected, cluster)
        _assert_same(got_term, expected, cluster)
        cluster.wait_pools_free()
