"""Issue 15 over the Redis control plane: a router that knows its workers only from the
registry (a real ``redis-server``; 1 prefill + 2 decode worker processes registered under
their ``--worker-id``) migrates the streams of a decode worker killed mid-decode to the other
one, and every client's every gRPC delta and SSE chunk equals the uninterrupted run's (greedy:
HF's); the killed worker leaves routing within its registry lease; every pool ends free."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.faults.cluster import Cluster
from tests.faults.migration_mix import assert_same, migrations, mix, run_mix, uninterrupted
from tests.redis_harness import redis_server
from tests.router.server_harness import launch
from tests.services.workers import WorkerProcess, spawn_worker, wait_started

STALL_S = 6.0  # decode heartbeats every ~1 s; generous for a loaded 2-core machine
LEASE_S = 5.0  # each worker's registry lease (2 s lapsed under CI's load: heartbeats are late)


@contextmanager
def _redis_cluster(model: Path, tmp_path: Path) -> Iterator[Cluster]:
    with redis_server(tmp_path / "redis") as redis:
        flags = ["--redis-url", redis.url, "--cluster-name", "migration"]
        workers: list[WorkerProcess] = []
        router = None
        try:
            registry = [
                *flags,
                "--registry-lease-s",
                str(LEASE_S),
                "--registry-heartbeat-s",
                "0.25",
            ]
            for role, name in (("decode", "decode-a"), ("decode", "decode-b"), ("prefill", "p")):
                transport = ["--kv-transport", "tcp"] if role == "decode" else []
                args = [*registry, *transport, "--worker-id", name]
                workers.append(spawn_worker(role, model, *args, num_kv_blocks=1024))
            for w in workers:
                wait_started(w)
            router = launch(
                ["router", "--model", str(model), *flags, "--stall-timeout-s", str(STALL_S)],
                False,
            )
            cluster = Cluster(
                router,
                [w for w in workers if w.role == "prefill"],
                [w for w in workers if w.role == "decode"],
            )
            _wait_routable(cluster)
            yield cluster
        finally:
            if router is not None:
                router.stop()
            for w in workers:
                w.stop()


def _wait_routable(cluster: Cluster, timeout_s: float = 60.0) -> None:
    """Until the router's load counts every live worker's blocks (all of them registered)."""
    deadline = time.monotonic() + timeout_s
    live = [w for w in cluster.workers if w.is_alive]
    while cluster.router.health()["load"]["num_blocks"] != sum(w.load().num_blocks for w in live):
        assert time.monotonic() < deadline, "the router did not see every worker registered"
        time.sleep(0.2)


def test_a_killed_decode_worker_s_streams_migrate_over_the_redis_control_plane(
    llama: Path, tmp_path: Path
) -> None:
    with _redis_cluster(llama, tmp_path) as cluster:
        expected, stop = uninterrupted(cluster, llama)
        reqs = mix(stop)

        def kill_the_busier() -> None:
            busier = max(cluster.decode, key=lambda w: w.load().num_running_requests)
            busier.kill()

        got = asyncio.run(run_mix(cluster, reqs, kill_the_busier))
        assert_same(got, expected, cluster)
        assert migrations(cluster).get(("decode", "worker_lost"), 0) >= 1, migrations(cluster)
        cluster.wait_pools_free()
        # The registry drops the killed worker (no unregister: its lease lapses).
        _wait_routable(cluster, timeout_s=LEASE_S + 10)
