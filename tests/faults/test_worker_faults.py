"""Defects 3, 4 and 6 of issue 12: a dead or stalled worker gets every client a clear answer.

3. With no prefill worker left, a request needing one gets 503 / UNAVAILABLE with OpenAI's
   error body (an error event, then ``[DONE]``, in a stream that has started), never an empty
   answer.
4. A decode worker that stops (SIGSTOP) fails its in-flight streams within the router's
   ``--stall-timeout-s`` with a message saying it stalled; the other worker's streams finish;
   once it runs again, everything it held is freed.
6. ``/health`` does not count a dead worker's blocks.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import httpx

from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.faults.clients import Outcome, grpc_generate, http_complete, http_stream
from tests.faults.cluster import Cluster, start_cluster

PROMPT = list(range(40, 80))  # 40 tokens: remote prefill (the router's threshold is 0)
STALL_S = 4.0  # decode heartbeats every ~1 s; generous for a loaded machine


def _wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _decode_blocks(cluster: Cluster, alive: list[int]) -> int:
    return sum(cluster.decode[i].load().num_blocks for i in alive)


def test_dead_prefill_gives_503_and_dead_workers_leave_health(llama: Path) -> None:
    with start_cluster(llama, num_decode=2) as cluster:
        url = cluster.url
        total = cluster.router.health()["load"]["num_blocks"]
        assert total == sum(w.load().num_blocks for w in cluster.workers)
        # Defect 6: a dead decode worker's blocks leave /health's load.
        cluster.decode[1].kill()
        alive_blocks = sum(w.load().num_blocks for w in (cluster.prefill[0], cluster.decode[0]))
        _wait_for(lambda: cluster.router.health()["load"]["num_blocks"] == alive_blocks)
        # Defect 3: the only prefill worker dies.
        cluster.prefill[0].kill()
        _wait_for(lambda: cluster.router.health()["status"] == "unavailable")

        async def requests() -> tuple[Outcome, Outcome, Outcome]:
            async with (
                httpx.AsyncClient(timeout=30) as client,
                grpc.aio.insecure_channel(cluster.router.grpc_address) as channel,
            ):
                whole = await http_complete(client, url, PROMPT, 8)
                streamed = await http_stream(client, url, PROMPT, 8)
                rpc = await grpc_generate(pb_grpc.GenerationServiceStub(channel), PROMPT, 8)
            return whole, streamed, rpc

        start = time.monotonic()
        whole, streamed, rpc = asyncio.run(requests())
        assert time.monotonic() - start < 10
        assert whole.status == 503, whole
        assert whole.error is not None and '"type":"service_unavailable"' in whole.error.replace(
            " ", ""
        )
        assert "prefill" in whole.error
        assert streamed.status == 200 and streamed.done, streamed
        assert streamed.error is not None and "prefill" in streamed.error, streamed
        assert rpc.error is not None and rpc.error.startswith("UNAVAILABLE"), rpc
        assert "prefill" in rpc.error
        # Everything the surviving decode worker reserved for those requests is free again.
        cluster.wait_pools_free()
        assert cluster.router.health()["load"]["num_blocks"] == cluster.decode[0].load().num_blocks


def test_a_stalled_decode_worker_fails_its_streams_within_the_stall_timeout(llama: Path) -> None:
    with start_cluster(
        # Migration off: this pins the stall detection itself (tests/faults/test_migration.py
        # has the stalled streams continue elsewhere).
        llama,
        num_decode=2,
        router_args=["--stall-timeout-s", str(STALL_S), "--migration-limit", "0"],
    ) as cluster:
        url = cluster.url

        async def scenario() -> tuple[list[Outcome], float, Outcome]:
            async with httpx.AsyncClient(timeout=60) as client:
                # Long streams, one at a time, each its own prompt (no prefix for kv_aware to
                # follow), so the router (most free blocks first, from a load polled every
                # 0.1 s) spreads them over both decode workers. The tiny model decodes fast
                # and a loaded machine delays arrivals, so wait until a worker holds streams
                # while another stream is elsewhere (running or done), and stall that one.
                tasks = []
                for i in range(6):
                    prompt = [t + 50 * i for t in PROMPT]
                    tasks.append(asyncio.ensure_future(http_stream(client, url, prompt, 1500)))
                    await asyncio.sleep(0.4)
                deadline = time.monotonic() + 30
                while True:
                    loads = [await asyncio.to_thread(w.load) for w in cluster.decode]
                    busiest = max(range(len(loads)), key=lambda j: loads[j].num_running_requests)
                    others = sum(loads[j].num_running_requests for j in range(len(loads))
                                 if j != busiest) + sum(t.done() for t in tasks)  # fmt: skip
                    if loads[busiest].num_running_requests and others:
                        break
                    assert time.monotonic() < deadline, loads
                    await asyncio.sleep(0.05)
                stalled_worker.append(cluster.decode[busiest])
                stalled_worker[0].pause()
                paused = time.monotonic()
                outs = await asyncio.gather(*tasks)
                # New requests avoid the stalled worker.
                after = await http_stream(client, url, PROMPT, 8)
            return outs, paused, after

        stalled_worker: list[Any] = []
        try:
            outs, paused, after = asyncio.run(scenario())
        finally:
            for w in stalled_worker:
                w.resume()
        stalled = [o for o in outs if o.error is not None]
        finished = [o for o in outs if o.error is None]
        assert stalled and finished, outs  # both workers had streams
        for o in stalled:
            assert o.done and "stalled" in o.error, o  # type: ignore[operator]
            # Within the stall timeout (plus generous slack for a loaded machine).
            assert o.ended_at - paused < STALL_S + 10, o.ended_at - paused
        for o in finished:
            assert o.done and o.finish_reason == "length", o
        assert after.error is None and after.finish_reason == "length", after
        cluster.wait_pools_free()
