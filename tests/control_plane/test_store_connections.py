"""The control plane's Redis client over connections Redis closed while they sat in the pool
(a restart, a ``CLIENT KILL``, an idle timeout): calls that are safe to repeat go through on a
fresh connection; the rest fail once, clearly, and the next call works."""

from __future__ import annotations

import asyncio

import redis as sync_redis

from control_plane.redis_call import ControlPlaneUnavailable
from control_plane.redis_store import RedisStore
from control_plane.worker_info import ModelFingerprint, WorkerInfo
from tests.redis_harness import RedisServer

FP = ModelFingerprint("demo", "llama", "float32", 16, 2, 2, 32)


def _info(worker_id: str) -> WorkerInfo:
    return WorkerInfo(worker_id, "decode", "127.0.0.1:1", FP, num_blocks=10, kv_endpoint="")


def _kill_clients(redis: RedisServer) -> int:
    """Close every other client's connection from the server's side; returns how many."""
    with sync_redis.Redis.from_url(redis.url) as admin:
        return int(admin.client_kill_filter(_type="normal", skipme=True))


async def _stale_pool(store: RedisStore, redis: RedisServer) -> None:
    """Leave ``store`` with pooled connections that Redis has closed."""
    await asyncio.gather(*(store.now() for _ in range(3)))  # several pooled connections
    assert _kill_clients(redis) >= 1
    await asyncio.sleep(0.05)  # the close reaches this side


def test_unregister_and_reads_go_through_on_a_fresh_connection(redis: RedisServer) -> None:
    """CI flaked on this: after a Redis restart a worker's graceful leave went out on a
    connection pooled before it, failed, and the member stayed until its lease lapsed."""

    async def main() -> None:
        store = RedisStore(redis.url, cluster="t")
        epoch, _ = await store.register(_info("d1"), lease_s=30.0)
        await _stale_pool(store, redis)
        assert await store.unregister("d1", epoch) == 0
        _, members = await store.list_members()
        assert members == []
        await _stale_pool(store, redis)
        _, members = await store.list_members()  # reads repeat safely too
        assert members == []
        assert await store.last_event_id() != b""
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_heartbeat_goes_through_on_a_fresh_connection(redis: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis.url, cluster="t")
        epoch, _ = await store.register(_info("d1"), lease_s=30.0)
        await _stale_pool(store, redis)
        assert await store.heartbeat("d1", epoch, 30.0) == 0
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_call_that_is_not_safe_to_repeat_fails_once_and_the_next_works(
    redis: RedisServer,
) -> None:
    """Registering takes a new epoch: it is not sent twice behind the caller's back."""

    async def main() -> None:
        store = RedisStore(redis.url, cluster="t")
        first, _ = await store.register(_info("d1"), lease_s=30.0)
        await _stale_pool(store, redis)
        try:
            second, _ = await store.register(_info("d1"), lease_s=30.0)
        except ControlPlaneUnavailable as e:
            assert "redis at" in str(e)
            second, _ = await store.register(_info("d1"), lease_s=30.0)
        assert second == first + 1  # exactly one new epoch, whichever way it went
        await store.close()

    asyncio.run(asyncio.wait_for(main(), 30))
