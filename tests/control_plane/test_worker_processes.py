"""Real worker processes in the control plane: they serve ``WorkerControl`` beside their own
service, register in a real ``redis-server`` under their ``--worker-id`` with the engine's
fingerprint, publish their prefix-cache events, and unregister first when they drain."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from control_plane.grpc_control import WorkerControlClient
from control_plane.redis_store import RedisStore
from control_plane.worker_info import WorkerInfo
from tests.conftest import TINY_ARCHS
from tests.redis_harness import RedisServer
from tests.services.workers import spawn_worker, wait_started


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


async def _members(url: str) -> dict[str, WorkerInfo]:
    store = RedisStore(url, "test")
    try:
        _, infos = await store.list_members()
    finally:
        await store.close()
    return {i.worker_id: i for i in infos}


def _wait_for(predicate, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_workers_register_publish_and_unregister_on_drain(llama: Path, redis: RedisServer) -> None:
    flags = ["--redis-url", redis.url, "--cluster-name", "test", "--registry-lease-s", "2"]
    decode = spawn_worker("decode", llama, *flags, "--worker-id", "decode-a")
    prefill = spawn_worker("prefill", llama, *flags, "--worker-id", "prefill-a")
    try:
        wait_started(decode)
        wait_started(prefill)
        members = _wait_for(lambda: (m := asyncio.run(_members(redis.url))) and len(m) == 2 and m)
        assert set(members) == {"decode-a", "prefill-a"}, members
        d, p = members["decode-a"], members["prefill-a"]
        assert (d.role, p.role) == ("decode", "prefill")
        assert d.grpc_address == decode.target and p.grpc_address == prefill.target
        assert d.kv_endpoint and d.transport in ("tcp", "ucx")
        assert d.fingerprint == p.fingerprint
        assert d.fingerprint.block_size == 16 and d.fingerprint.dtype == "float32"
        assert d.num_blocks == 128 and d.epoch >= 1

        async def ask(target: str) -> WorkerInfo:
            async with grpc.aio.insecure_channel(target) as channel:
                return await WorkerControlClient(channel).info()

        assert asyncio.run(ask(decode.target)).worker_id == "decode-a"
        assert asyncio.run(ask(prefill.target)).epoch == p.epoch

        # SIGTERM: the record goes first (routers stop sending), then the process exits.
        decode.proc.terminate()
        gone = _wait_for(lambda: "decode-a" not in asyncio.run(_members(redis.url)), 10.0)
        assert gone
        assert decode.proc.wait(timeout=15) == 0, decode.output()
        assert "prefill-a" in asyncio.run(_members(redis.url))
    finally:
        decode.kill()
        prefill.stop()
