"""Defect 5 of issue 12: SIGTERM drains gracefully and promptly.

On SIGTERM a process reports NOT_SERVING at once and admits nothing new; the requests in flight
get ``--shutdown-grace-s`` to finish; those that cannot get a clear error (an error event and
``[DONE]`` in a stream), never a silent cut; every process is gone within grace + 2 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from decode_service.server import SERVICE_NAME as DECODE_SERVICE
from tests.conftest import TINY_ARCHS
from tests.faults.clients import Outcome, http_stream
from tests.faults.cluster import start_cluster
from tests.router.server_harness import start_server
from tests.services.workers import child_pids

GRACE_S = 3.0
EXIT_SLACK_S = 2.0  # the bound: every process gone within grace + 2 s
PROMPT = list(range(40, 80))
# Output tokens: done well within the grace / far from done at it. LONG is long enough that
# no machine finishes it within the grace (1900 did, on a fast CI machine), so its model has
# a long context; LONG_BLOCKS holds one such request.
SHORT, LONG = 8, 16_000
LONG_BLOCKS = 1100


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama-16k", **TINY_ARCHS["llama"], max_position_embeddings=16_384)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _health(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        return int(
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            .status
        )


def _check_drained_streams(short: list[Outcome], long: list[Outcome]) -> None:
    for o in short:
        assert o.error is None and o.finish_reason == "length" and o.done, o
    for o in long:
        assert o.done, f"stream cut without [DONE]: {o}"
        assert o.error is not None and "shutting down" in o.error, o


def test_sigterm_drains_pdserve_serve_within_the_grace(llama: Path) -> None:
    server = start_server(
        llama,
        "--kv-transport", "tcp", "--num-kv-blocks", str(6 * LONG_BLOCKS),
        "--shutdown-grace-s", str(GRACE_S),
        colocated=False,
    )  # fmt: skip
    pids = [server.process.pid, *child_pids(server.process.pid)]
    assert len(pids) == 3, pids  # router, prefill and decode
    url = server.http_url

    async def scenario() -> tuple[list[Outcome], list[Outcome], int, float]:
        async with httpx.AsyncClient(timeout=60) as client:
            short = [
                asyncio.ensure_future(http_stream(client, url, PROMPT, SHORT)) for _ in range(2)
            ]
            long = [asyncio.ensure_future(http_stream(client, url, PROMPT, LONG)) for _ in range(5)]
            await asyncio.sleep(1.0)  # every stream has started
            server.process.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            await asyncio.sleep(0.3)
            refused = await client.post(
                f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}
            )
            return (
                list(await asyncio.gather(*short)),
                list(await asyncio.gather(*long)),
                refused.status_code,
                sent,
            )

    gone: dict[int, float] = {}  # pid -> seconds after SIGTERM
    try:
        short, long, refused, sent = asyncio.run(scenario())
        while len(gone) < len(pids) and time.monotonic() - sent < 30:
            gone.update(
                (p, time.monotonic() - sent) for p in pids if p not in gone and not _alive(p)
            )
            time.sleep(0.02)
        gone_after = max(gone.values(), default=30.0)
    finally:
        server.stop()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    assert refused == 503
    _check_drained_streams(short, long)
    assert gone_after < GRACE_S + EXIT_SLACK_S, f"gone after (s, router first): {gone} {pids}"


def test_sigterm_drains_a_standalone_decode_worker(llama: Path) -> None:
    with start_cluster(
        llama, decode_args=["--shutdown-grace-s", str(GRACE_S)], num_kv_blocks=2 * LONG_BLOCKS
    ) as cluster:
        decode, url = cluster.decode[0], cluster.url

        async def scenario() -> tuple[list[Outcome], list[Outcome], float, tuple[int, int]]:
            async with httpx.AsyncClient(timeout=60) as client:
                short = [asyncio.ensure_future(http_stream(client, url, PROMPT, SHORT))]
                long = [asyncio.ensure_future(http_stream(client, url, PROMPT, LONG))]
                await asyncio.sleep(1.0)
                decode.proc.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                await asyncio.sleep(0.3)
                # Readiness (the role's service) off, liveness ("") on: not restarted.
                status = _health(decode.target, DECODE_SERVICE), _health(decode.target)
                short_outs = list(await asyncio.gather(*short))
                return short_outs, list(await asyncio.gather(*long)), sent, status

        short, long, sent, status = asyncio.run(scenario())
        try:
            decode.proc.wait(30)
        finally:
            gone_after = time.monotonic() - sent
        assert status == (
            health_pb2.HealthCheckResponse.NOT_SERVING,
            health_pb2.HealthCheckResponse.SERVING,
        )
        _check_drained_streams(short, long)
        assert gone_after < GRACE_S + EXIT_SLACK_S, f"decode alive {gone_after:.1f}s after SIGTERM"
        cluster.wait_pools_free()  # the prefill worker's pool
