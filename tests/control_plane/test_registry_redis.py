"""The registry against a real redis-server: leases, epochs and fencing, membership events and
re-lists, load reports, Redis restarts and outages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from control_plane import lua
from control_plane.cluster_view import ClusterView
from control_plane.load_report import LoadReport
from control_plane.redis_call import ControlPlaneUnavailable
from control_plane.redis_source import RedisClusterSource
from control_plane.redis_store import RedisStore
from control_plane.worker_agent import LoadSample, WorkerAgent
from control_plane.worker_info import ModelFingerprint, WorkerInfo, WorkerRole, WorkerState
from tests.redis_harness import RedisServer

FP = ModelFingerprint("demo", "llama", "float32", 16, 2, 2, 32)


def info(worker_id: str, role: WorkerRole = "decode", fp: ModelFingerprint = FP) -> WorkerInfo:
    return WorkerInfo(
        worker_id,
        role,
        f"127.0.0.1:{abs(hash(worker_id)) % 50000 + 1000}",
        fp,
        num_blocks=100,
        kv_endpoint="tcp://127.0.0.1:1",
    )


def sample(free: int = 90) -> Callable[[], LoadSample]:
    return lambda: LoadSample(100, free, 2, 1, 0, 0.01)


async def until(cond: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.02)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 60))


def test_register_heartbeat_list_and_load(redis: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis.url, cluster="t")
        agent = WorkerAgent(store, info("d1"), sample(free=77), lease_s=1.5, interval_s=0.1)
        await agent.start()
        assert agent.epoch == 1
        view = ClusterView(FP)
        source = RedisClusterSource(store, view, relist_s=0.3, load_poll_s=0.05)
        await source.start()
        await until(lambda: view.load_of("d1") is not None, what="a load report")
        report = view.load_of("d1")
        assert report is not None and report.num_free_blocks == 77 and report.epoch == 1
        assert [m.worker_id for m in view.routable("decode")] == ["d1"]
        assert view.routable("prefill") == []
        v = view.view("d1")
        assert not v.is_stale and v.num_used_blocks == 23
        view.sent("d1", "r1", num_blocks=10)
        assert view.view("d1").num_used_blocks == 33  # counted until the next report has it
        await agent.stop()
        await until(lambda: view.members() == [], what="unregister seen")
        await source.close()
        await store.close()

    run(main)


def test_killed_worker_leaves_routing_within_one_lease(redis: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis.url, cluster="t")
        agent = WorkerAgent(store, info("d1"), sample(), lease_s=1.0, interval_s=0.1)
        await agent.start()
        view = ClusterView(FP)
        source = RedisClusterSource(store, view, relist_s=5.0)  # re-list slower than the lease
        await source.start()
        await until(lambda: len(view.routable("decode")) == 1)
        await agent._stop_loop()  # the process dies: no unregister, heartbeats just stop
        killed = time.monotonic()
        await until(lambda: not view.routable("decode"), timeout_s=3.0, what="lease expiry")
        assert time.monotonic() - killed <= 1.0 + 0.3
        await source.close()
        await store.close()

    run(main)


def test_restart_with_same_id_fences_the_old_process(redis: RedisServer) -> None:
    async def main() -> None:
        old_store, new_store = RedisStore(redis.url, cluster="t"), RedisStore(redis.url, "t")
        fenced: list[str] = []
        old = WorkerAgent(
            old_store,
            info("d1"),
            sample(free=11),
            lease_s=1.0,
            interval_s=0.1,
            on_fenced=lambda: fenced.append("old"),
        )
        await old.start()
        new = WorkerAgent(new_store, info("d1"), sample(free=55), lease_s=1.0, interval_s=0.1)
        await new.start()
        assert (old.epoch, new.epoch) == (1, 2)
        await until(lambda: old.is_fenced, what="the old process to notice")
        assert fenced == ["old"] and old.stats.fenced == 1
        # Every write of the stale epoch is refused atomically.
        stale = LoadReport("d1", 1, 99, 0.0, 100, 1, 0, 0)
        assert await old_store.heartbeat("d1", 1, 1.0, stale) == lua.FENCED
        assert await old_store.set_state("d1", 1, WorkerState.DRAINING) == lua.FENCED
        assert await old_store.unregister("d1", 1) == lua.FENCED
        await old.stop()  # a fenced process does not unregister its successor
        _, members = await new_store.list_members()
        assert [(m.worker_id, m.epoch, m.state) for m in members] == [
            ("d1", 2, WorkerState.SERVING)
        ]
        _, loads = await new_store.read_loads(["d1"])
        assert loads["d1"].epoch == 2 and loads["d1"].num_free_blocks == 55
        await new.stop()
        for s in (old_store, new_store):
            await s.close()

    run(main)


def test_missed_membership_event_is_repaired_by_the_relist(redis: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis.url, cluster="t")
        agent = WorkerAgent(store, info("d1"), sample(), lease_s=30.0, interval_s=0.1)
        await agent.start()
        view = ClusterView(FP)
        source = RedisClusterSource(store, view, relist_s=0.5)
        await source.start()
        await until(lambda: len(view.routable("decode")) == 1)
        await agent._stop_loop()
        # The worker dies and its record disappears, but the "leave" event is lost (an operator
        # trimmed the stream, or a router was disconnected when it came): remove the record
        # behind the registry's back and drop the whole event stream.
        raw = store._redis
        await raw.delete(store.keys.worker("d1"), store.keys.events)
        await until(lambda: not view.members(), timeout_s=2.0, what="the re-list")
        await source.close()
        await store.close()

    run(main)


async def _two_workers_and_a_router(
    redis: RedisServer, lease_s: float, interval_s: float, relist_s: float
) -> tuple[RedisStore, list[WorkerAgent], ClusterView, RedisClusterSource]:
    """A decode and a prefill worker registered, and a router's view that lists both."""
    store = RedisStore(redis.url, cluster="t")
    roles: tuple[tuple[str, WorkerRole], ...] = (("d1", "decode"), ("p1", "prefill"))
    agents = [
        WorkerAgent(store, info(w, role), sample(), lease_s=lease_s, interval_s=interval_s)
        for w, role in roles
    ]
    for a in agents:
        await a.start()
    view = ClusterView(FP)
    source = RedisClusterSource(RedisStore(redis.url, cluster="t"), view, relist_s=relist_s)
    await source.start()
    await until(lambda: len(view.members()) == 2)
    return store, agents, view, source


def test_redis_restart_rebuilds_the_registry_from_heartbeats(redis: RedisServer) -> None:
    async def main() -> None:
        store, agents, view, source = await _two_workers_and_a_router(redis, 1.0, 0.1, 0.3)
        redis.restart()  # empty: no persistence
        await until(
            lambda: all(a.stats.reregistrations >= 1 for a in agents),
            what="re-registration after the restart",
        )
        # A fresh client reads what Redis holds: a connection pooled before the restart is
        # closed by it, and the store does not retry (its callers treat that as an outage).
        fresh = RedisStore(redis.url, cluster="t")
        _, members = await fresh.list_members()
        await fresh.close()
        assert sorted((m.worker_id, m.epoch) for m in members) == [("d1", 2), ("p1", 2)]
        await until(
            lambda: sorted(m.epoch for m in view.members()) == [2, 2],
            what="routers to see the new epochs",
        )
        assert not view.in_outage
        for a in agents:
            await a.stop()
        await source.close()
        await source.store.close()
        await store.close()

    run(main)


def test_after_redis_loses_its_data_no_worker_drops_out_while_it_registers_again(
    redis: RedisServer,
) -> None:
    """A Redis restarted empty lists nobody until each worker's next heartbeat; a router that
    re-listed in between used to drop them (a pool with one worker had none to route to, and
    CI's two-router test saw 3 of 4 workers). Redis's generation marker tells a data loss from
    a worker leaving: the members it forgot stay while the leases they held last, and once
    back, leave at once again."""

    async def main() -> None:
        store, agents, view, source = await _two_workers_and_a_router(redis, 8.0, 1.5, 0.1)
        generation = (await source.store.listing()).generation
        redis.restart()  # empty: no persistence
        seen: list[int] = []
        while not all(a.stats.reregistrations >= 1 for a in agents):
            seen.append(len(view.routable("decode")) + len(view.routable("prefill")))
            await asyncio.sleep(0.02)
        assert (await source.store.listing()).generation != generation
        assert seen and min(seen) == 2, seen
        await until(
            lambda: sorted(m.epoch for m in view.members()) == [2, 2],
            what="routers to see the new epochs",
        )
        for a in agents:
            await a.stop()
        await until(lambda: not view.members(), timeout_s=2.0, what="the leave events")
        await source.close()
        await source.store.close()
        await store.close()

    run(main)


def test_outage_keeps_the_last_membership_and_every_call_is_bounded(
    redis: RedisServer,
) -> None:
    async def main() -> None:
        store = RedisStore(redis.url, cluster="t", timeout_s=0.3)
        agent = WorkerAgent(store, info("d1"), sample(), lease_s=1.0, interval_s=0.1)
        await agent.start()
        view = ClusterView(FP)
        rstore = RedisStore(redis.url, cluster="t", timeout_s=0.3)
        source = RedisClusterSource(rstore, view, relist_s=0.2)
        await source.start()
        await until(lambda: len(view.routable("decode")) == 1)
        redis.pause()  # SIGSTOP: connections hang, they are not refused
        try:
            started = time.monotonic()
            with pytest.raises(ControlPlaneUnavailable):
                await rstore.list_members()
            assert time.monotonic() - started < 1.5
            await until(lambda: view.in_outage, what="the outage to be noticed")
            await asyncio.sleep(1.5)  # past the lease: still routable on what we knew
            assert [m.worker_id for m in view.routable("decode")] == ["d1"]
            assert view.stats.outages == 1 and agent.stats.lease_renew_failures > 0
        finally:
            redis.resume()
        await until(lambda: not view.in_outage, what="recovery")
        assert view.stats.outage_seconds > 1.0
        assert [m.worker_id for m in view.routable("decode")] == ["d1"]
        await agent.stop()
        await source.close()
        for s in (store, rstore):
            await s.close()

    run(main)


def test_fingerprint_mismatch_is_refused_loudly(redis: RedisServer) -> None:
    async def main() -> None:
        store = RedisStore(redis.url, cluster="t")
        other = ModelFingerprint("demo", "llama", "float32", 32, 2, 2, 32)  # block size 32
        good = WorkerAgent(store, info("d1"), sample(), lease_s=2.0, interval_s=0.1)
        bad = WorkerAgent(store, info("d2", fp=other), sample(), lease_s=2.0, interval_s=0.1)
        for a in (good, bad):
            await a.start()
        view = ClusterView(FP)
        source = RedisClusterSource(store, view, relist_s=0.2)
        await source.start()
        await asyncio.sleep(0.5)
        assert [m.worker_id for m in view.members()] == ["d1"]
        assert view.stats.fingerprint_mismatches == 1  # logged once, not on every re-list
        for a in (good, bad):
            await a.stop()
        await source.close()
        await store.close()

    run(main)


def test_clusters_share_one_redis_without_seeing_each_other(redis: RedisServer) -> None:
    async def main() -> None:
        a_store, b_store = RedisStore(redis.url, cluster="a"), RedisStore(redis.url, "b")
        agent = WorkerAgent(a_store, info("d1"), sample(), lease_s=2.0, interval_s=0.1)
        await agent.start()
        _, in_a = await a_store.list_members()
        _, in_b = await b_store.list_members()
        assert [m.worker_id for m in in_a] == ["d1"] and in_b == []
        await agent.stop()
        for s in (a_store, b_store):
            await s.close()

    run(main)
