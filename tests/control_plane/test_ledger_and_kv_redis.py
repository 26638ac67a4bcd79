"""Cross-router dispatch reservations and the KV event stream, against a real redis-server."""

from __future__ import annotations

import asyncio

from control_plane.cluster_view import ClusterView
from control_plane.kv_events import KVEventLog, KVSnapshot
from control_plane.ledger import LocalLedger, RedisLedger
from control_plane.redis_source import RedisClusterSource
from control_plane.redis_store import RedisStore
from control_plane.worker_agent import LoadSample, WorkerAgent
from control_plane.worker_info import WorkerInfo
from engine.block_hash import hash_block_tokens
from tests.control_plane.test_registry_redis import FP, info, run, until
from tests.redis_harness import RedisServer


async def _cluster(
    redis: RedisServer, free: dict[str, int], num_routers: int
) -> tuple[list[WorkerAgent], list[tuple[RedisStore, ClusterView, RedisClusterSource]]]:
    agents = []
    for worker_id, n in free.items():

        def sample(n: int = n) -> LoadSample:
            return LoadSample(100, n, 0, 0)

        agent = WorkerAgent(
            RedisStore(redis.url, "t"), info(worker_id), sample, lease_s=3.0, interval_s=0.1
        )
        await agent.start()
        agents.append(agent)
    routers = []
    for _ in range(num_routers):
        store = RedisStore(redis.url, "t")
        view = ClusterView(FP)
        source = RedisClusterSource(store, view, relist_s=0.5, load_poll_s=0.05)
        await source.start()
        routers.append((store, view, source))
    for _, view, _ in routers:

        def loaded(v: ClusterView = view) -> bool:
            return all(v.load_of(w) is not None for w in free)

        await until(loaded)
    return agents, routers


async def _close(agents: list[WorkerAgent], routers: list) -> None:
    for a in agents:
        await a.stop()
        await a.store.close()
    for store, _, source in routers:
        await source.close()
        await store.close()


def test_two_routers_never_both_take_the_last_room(redis: RedisServer) -> None:
    """d1 has room for one 30-block request, d2 for plenty. Two routers each rank d1 first
    and reserve at the same time: exactly one gets d1, the other is moved to d2."""

    async def main() -> None:
        agents, routers = await _cluster(redis, {"d1": 40, "d2": 100}, num_routers=2)
        ledgers = [RedisLedger(store, view) for store, view, _ in routers]
        ranked = [("d1", 0.0), ("d2", 10.0)]
        picks = await asyncio.gather(
            ledgers[0].reserve("a", 30, ranked), ledgers[1].reserve("b", 30, ranked)
        )
        assert sorted(picks) == ["d1", "d2"]  # type: ignore[type-var]
        assert sum(v.stats.cross_router_conflicts for _, v, _ in routers) == 1
        # Nobody has room for 80 more on d1; d2 still has 70 after b's 30.
        assert await ledgers[0].reserve("c", 80, ranked) is None
        assert await ledgers[0].reserve("d", 70, ranked) == "d2"
        # A released send stops counting at once.
        await ledgers[0].release("d2", "d")
        assert await ledgers[1].reserve("e", 70, ranked) == "d2"
        await _close(agents, routers)

    run(main)


def test_local_ledger_counts_its_own_sends_until_reported(redis: RedisServer) -> None:
    async def main() -> None:
        agents, routers = await _cluster(redis, {"d1": 50}, num_routers=1)
        _, view, _ = routers[0]
        ledger = LocalLedger(view)
        assert await ledger.reserve("a", 30, [("d1", 0.0)]) == "d1"
        assert await ledger.reserve("b", 30, [("d1", 0.0)]) is None  # 50 - 30 < 30
        await ledger.release("d1", "a")
        assert await ledger.reserve("b", 30, [("d1", 0.0)]) == "d1"
        await _close(agents, routers)

    run(main)


def test_kv_events_flow_and_gaps_take_a_snapshot(redis: RedisServer) -> None:
    async def main() -> None:
        log = KVEventLog("p1", generation=0)
        store = RedisStore(redis.url, "t")
        agent = WorkerAgent(
            store,
            info("p1", role="prefill"),
            lambda: LoadSample(100, 100, 0, 0),
            kv_log=log,
            lease_s=3.0,
            interval_s=0.05,
        )
        await agent.start()
        snapshots: list[str] = []

        async def snapshot(worker: WorkerInfo) -> KVSnapshot:  # the worker's own log
            snapshots.append(worker.worker_id)
            return log.snapshot()

        rstore = RedisStore(redis.url, "t")
        view = ClusterView(FP)
        source = RedisClusterSource(
            rstore, view, snapshot_fn=snapshot, relist_s=0.5, kv_block_s=0.1
        )
        await source.start()
        await until(lambda: snapshots == ["p1"], what="the first snapshot")
        h = hash_block_tokens(list(range(64)), 16)
        log.record_stored(h)
        await until(lambda: view.kv_index.overlap(h) == {"p1": 4}, what="stored events")
        assert snapshots == ["p1"]  # events, not snapshots, carried that
        # Lose a batch on the way (a publish that failed): the next one reveals the gap.
        log.record_removed(h[2:])
        assert log.take_unpublished() is not None  # dropped, never published
        other = hash_block_tokens(list(range(100, 132)), 16)
        log.record_stored(other)
        await until(lambda: view.kv_index.overlap(h) == {"p1": 2}, what="the snapshot")
        assert snapshots == ["p1", "p1"]
        assert view.kv_index.overlap(other) == {"p1": 2}
        # Trim the stream under the router and restart the worker's registration (new
        # generation): the index follows the new process only.
        await agent.store._redis.delete(agent.store.keys.worker("p1"))
        await until(lambda: agent.stats.reregistrations == 1, what="re-registration")
        log.record_cleared()
        await until(lambda: view.kv_index.overlap(other) == {}, what="the new generation")
        await agent.stop()
        await source.close()
        for s in (store, rstore):
            await s.close()

    run(main)
