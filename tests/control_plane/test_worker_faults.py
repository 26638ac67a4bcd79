"""Worker faults with every part real: a ``redis-server``, 2 decode + 2 prefill worker
processes registered in it under their ``--worker-id``, and three ``pdserve router
--redis-url`` processes (kv_aware, least_loaded, round_robin) that know the workers only
from the registry.

- ``kill -9`` a decode worker: every router drops it within one registry lease (plus the
  polling of this test), and requests keep succeeding on the other one;
- restart it with the same ``--worker-id``: the registry gives it a new epoch, every write
  carrying the old epoch is refused by the store's Lua scripts in the real Redis, and the
  routers route to it again;
- a missed membership event: a worker drains (its "leave" event is written) while a router
  is stopped (SIGSTOP), the event is deleted from the stream before the router wakes; the
  router's periodic re-list still drops the worker long before the 30 s lease it last saw
  would have.

Every answer is HF-exact greedy, through each routing path the routers took; every pool is
free at the end."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from control_plane import lua
from control_plane.kv_events import KVEvent, KVEventBatch, KVEventKind
from control_plane.load_report import LoadReport
from control_plane.redis_store import RedisStore
from control_plane.worker_info import WorkerInfo, WorkerState
from tests.conftest import TINY_ARCHS
from tests.control_plane.test_cluster_redis import _complete, _metric
from tests.engine.engine_utils import random_prompts
from tests.hf_oracle import hf_greedy
from tests.redis_harness import RedisServer
from tests.router.server_harness import Server, launch
from tests.services.workers import WorkerProcess, spawn_worker, wait_pools_free, wait_started

CLUSTER = "faults"
LEASE_S = 2.0  # the killed worker's registry lease
LONG_LEASE_S = 30.0  # the worker whose "leave" event goes missing
POLICIES = ("kv_aware", "least_loaded", "round_robin")
T = TypeVar("T")


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


def _wait(what: str, value: Callable[[], T], timeout_s: float = 60.0, every_s: float = 0.1) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        got = value()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


def _routable(router: Server) -> dict[str, float]:
    """pool -> workers the router would route to now."""
    healthy = _metric(router, "pdserve_router_healthy_workers")
    return {k.split('pool="')[1].split('"')[0]: v for k, v in healthy.items()}


def _all_routable(routers: Sequence[Server], decode: int, prefill: int) -> bool:
    return all(_routable(r) == {"decode": decode, "prefill": prefill} for r in routers)


async def _members(url: str) -> dict[str, WorkerInfo]:
    store = RedisStore(url, CLUSTER)
    try:
        _, infos = await store.list_members()
    finally:
        await store.close()
    return {i.worker_id: i for i in infos}


def _routed_to(routers: Sequence[Server], worker_id: str) -> float:
    """Requests the routers sent to ``worker_id`` (pdserve_router_routed_requests_total)."""
    return sum(
        v
        for r in routers
        for k, v in _metric(r, "pdserve_router_routed_requests_total").items()
        if f'worker_id="{worker_id}"' in k
    )


def _generated(worker: WorkerProcess) -> float:
    return worker.metrics()["pdserve_engine_generation_tokens_total"]


class Cluster:
    def __init__(self, model: Path, redis: RedisServer) -> None:
        self.model, self.redis = model, redis
        self.flags = ["--redis-url", redis.url, "--cluster-name", CLUSTER]
        self.workers: dict[str, WorkerProcess] = {}
        self.routers: dict[str, Server] = {}

    def spawn(self, role: str, worker_id: str, lease_s: float) -> WorkerProcess:
        extra = ["--kv-transport", "tcp"] if role == "decode" else []
        worker = spawn_worker(
            role,
            self.model,
            *self.flags,
            *extra,
            "--worker-id",
            worker_id,
            "--registry-lease-s",
            str(lease_s),
            "--registry-heartbeat-s",
            "0.25",
        )
        self.workers[worker_id] = worker
        return worker

    def ask(self, prompts: Sequence[list[int]], n: int) -> list[list[int]]:
        """Each prompt through every router in turn, all at once."""
        urls = [r.grpc_address for r in self.routers.values()]

        async def burst() -> list[list[int]]:
            return await asyncio.gather(
                *(_complete(urls[i % len(urls)], p, n) for i, p in enumerate(prompts))
            )

        return asyncio.run(burst())

    def stop(self) -> None:
        for router in self.routers.values():
            router.process.send_signal(signal.SIGCONT)
            router.stop()
        for worker in self.workers.values():
            worker.stop()


def test_killed_restarted_and_missed_workers_over_real_redis(
    llama: Path, redis: RedisServer
) -> None:
    cluster = Cluster(llama, redis)
    try:
        started = [
            cluster.spawn("decode", "decode-a", LEASE_S),
            cluster.spawn("decode", "decode-b", LONG_LEASE_S),
            cluster.spawn("prefill", "prefill-a", LEASE_S),
            cluster.spawn("prefill", "prefill-b", LEASE_S),
        ]
        for worker in started:
            wait_started(worker)
        for policy in POLICIES:
            cluster.routers[policy] = launch(
                ["router", "--model", str(llama), *cluster.flags, "--routing-policy", policy],
                False,
            )
        routers = list(cluster.routers.values())
        _wait("every router to see 2 + 2", lambda: _all_routable(routers, 2, 2))

        # Prompts of whole blocks (block size 16) sharing a 48-token prefix: the second
        # round finds them cached on the decode worker that served the first (kv_aware
        # prefills those locally) and the prefix on a prefill worker (a kv_hit).
        shared = random_prompts(1, 200, 48, 48, seed=7)[0]
        prompts = [shared + tail for tail in random_prompts(6, 200, 16, 16, seed=8)]
        expected = [hf_greedy(llama, p, 5) for p in prompts]
        for _ in range(2):
            assert cluster.ask(prompts, 5) == expected
            time.sleep(2.0)  # the KV events (every 0.25 s) reach the routers' indexes
        reasons = {
            k.split('reason="')[1].split('"')[0]
            for k, v in _metric(
                cluster.routers["kv_aware"], "pdserve_router_routing_decisions"
            ).items()
            if v > 0
        }
        assert "local_prefill" in reasons and reasons & {"kv_hit", "load"}, reasons
        assert "round_robin" in set(
            k.split('reason="')[1].split('"')[0]
            for k in _metric(cluster.routers["round_robin"], "pdserve_router_routing_decisions")
        )

        # (a) kill -9 decode-a: no unregister, its heartbeats just stop.
        old = asyncio.run(_members(redis.url))["decode-a"]
        cluster.workers["decode-a"].kill()
        killed = time.monotonic()
        _wait("the killed worker to leave routing", lambda: _all_routable(routers, 1, 2))
        gone_after = time.monotonic() - killed
        # One lease after its last heartbeat; the slack is this test's polling of three
        # routers' /metrics on a loaded machine, not the routers'.
        assert gone_after <= LEASE_S + 2.0, gone_after
        others = [p[::-1] for p in prompts]  # new prompts: nothing cached anywhere
        expected_others = [hf_greedy(llama, p, 5) for p in others]
        before = _generated(cluster.workers["decode-b"])
        sent_to_dead = _routed_to(routers, "decode-a")
        assert cluster.ask(others, 5) == expected_others
        assert _generated(cluster.workers["decode-b"]) > before
        assert _routed_to(routers, "decode-a") == sent_to_dead  # nothing tried the dead one

        # (b) restart with the same id: a new epoch fences the old one.
        wait_started(cluster.spawn("decode", "decode-a", LEASE_S))
        _wait("the restarted worker to rejoin routing", lambda: _all_routable(routers, 2, 2))
        new = asyncio.run(_members(redis.url))["decode-a"]
        assert new.epoch > old.epoch and new.grpc_address != old.grpc_address

        async def old_epoch_writes() -> list[int]:
            store = RedisStore(redis.url, CLUSTER)
            stale = LoadReport("decode-a", old.epoch, 10**6, 0.0, 128, 0, 0, 0)
            batch = KVEventBatch("decode-a", old.epoch, 1, (KVEvent(KVEventKind.CLEARED),))
            try:
                return [
                    await store.heartbeat("decode-a", old.epoch, LEASE_S, stale),
                    await store.set_state("decode-a", old.epoch, WorkerState.DRAINING),
                    await store.publish_kv("decode-a", old.epoch, batch),
                    await store.unregister("decode-a", old.epoch),
                ]
            finally:
                await store.close()

        assert asyncio.run(old_epoch_writes()) == [lua.FENCED] * 4
        after = asyncio.run(_members(redis.url))["decode-a"]
        assert (after.epoch, after.state, after.grpc_address) == (
            new.epoch,
            WorkerState.SERVING,
            new.grpc_address,
        )
        assert _all_routable(routers, 2, 2)
        fresh = random_prompts(9, 200, 20, 70, seed=9)
        expected_fresh = [hf_greedy(llama, p, 5) for p in fresh]
        before = _generated(cluster.workers["decode-a"])
        assert cluster.ask(fresh, 5) == expected_fresh
        assert _generated(cluster.workers["decode-a"]) > before  # it serves again
        restarted = cluster.workers["decode-a"].metrics()
        assert restarted["pdserve_worker_registered"] == 1
        assert restarted["pdserve_worker_fenced_total"] == 0

        # (c) decode-b drains while the kv_aware router sleeps; its "leave" event is deleted
        # before the router wakes. Only the re-list can tell the router it is gone: the
        # lease the router last saw runs 30 s more.
        watcher = cluster.routers["kv_aware"]
        watcher.process.send_signal(signal.SIGSTOP)
        try:
            drained = cluster.workers["decode-b"]
            drained.proc.terminate()
            assert drained.proc.wait(timeout=30) == 0, drained.output()

            async def drop_leave_events() -> int:
                store = RedisStore(redis.url, CLUSTER)
                raw = store._redis
                try:
                    entries = await raw.xrange(store.keys.events)
                    ids = [i for i, f in entries if f[b"worker_id"] == b"decode-b"]
                    if ids:
                        await raw.xdel(store.keys.events, *ids)
                    return len(ids)
                finally:
                    await store.close()

            assert asyncio.run(drop_leave_events()) >= 1
            assert "decode-b" not in asyncio.run(_members(redis.url))
        finally:
            watcher.process.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        _wait("the re-list to drop the drained worker", lambda: _routable(watcher)["decode"] == 1)
        assert time.monotonic() - resumed < LONG_LEASE_S / 3
        last = random_prompts(6, 200, 20, 70, seed=10)
        assert cluster.ask(last, 5) == [hf_greedy(llama, p, 5) for p in last]

        for router in routers:
            router.wait_pool_free(30)
        wait_pools_free([w for w in cluster.workers.values() if w.is_alive])
    finally:
        cluster.stop()
