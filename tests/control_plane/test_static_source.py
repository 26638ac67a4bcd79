"""The no-Redis source: a router learns a fixed worker list over the real ``WorkerControl``
gRPC service (a grpc.aio server on loopback)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc

from control_plane.cluster_view import ClusterView
from control_plane.grpc_control import WorkerControlClient, WorkerControlService
from control_plane.kv_events import KVEventLog
from control_plane.static_source import StaticClusterSource
from control_plane.worker_agent import LoadSample
from control_plane.worker_info import WorkerInfo
from engine.block_hash import hash_block_tokens
from protos.pdserve.v1 import control_pb2_grpc
from tests.control_plane.test_registry_redis import FP, info, run, until


class _Worker:
    def __init__(self, worker: WorkerInfo, keep: int = 1000, port: int = 0) -> None:
        self.info = worker
        self.free = 90
        self.log = KVEventLog(worker.worker_id, worker.epoch, keep=keep)
        self.server = grpc.aio.server()
        control_pb2_grpc.add_WorkerControlServicer_to_server(
            WorkerControlService(
                lambda: self.info, lambda: LoadSample(100, self.free, 1, 0, 64), self.log
            ),
            self.server,
        )
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(0)


def test_static_source_tracks_load_kv_and_failures() -> None:
    async def main() -> None:
        d = _Worker(info("d1"))
        p = _Worker(info("p1", role="prefill"), keep=4)
        for w in (d, p):
            await w.start()
        view = ClusterView(FP)
        source = StaticClusterSource(view, [d.address], [p.address], poll_s=0.05)
        await source.start()
        assert [m.worker_id for m in view.routable("decode")] == ["d1"]
        assert [m.worker_id for m in view.routable("prefill")] == ["p1"]
        report = view.load_of("p1")
        assert report is not None and report.num_queued_prefill_tokens == 64
        h = hash_block_tokens(list(range(48)), 16)
        p.log.record_stored(h)
        await until(lambda: view.kv_index.overlap(h) == {"p1": 3}, what="KV events")
        snaps = view.stats.kv_snapshots
        # More events than the worker keeps between two polls: a snapshot, still correct.
        p.log.record_removed(h[1:])
        p.log.record_stored(h[1:])
        p.log.record_removed(h[2:])
        p.log.record_stored(hash_block_tokens(list(range(200, 264)), 16))
        await until(lambda: view.kv_index.overlap(h) == {"p1": 2}, what="a snapshot")
        assert view.stats.kv_snapshots > snaps
        d.free = 10
        await until(lambda: view.view("d1").num_free_blocks == 10, what="new load")
        await d.stop()  # unreachable: out of routing until it answers again
        await until(lambda: not view.routable("decode"), what="the failure")
        await source.close()
        await p.stop()

    run(main)


def test_restart_behind_the_same_address_is_a_new_process() -> None:
    async def main() -> None:
        p = _Worker(replace(info("p1", role="prefill"), epoch=1))
        await p.start()
        view = ClusterView(FP)
        source = StaticClusterSource(view, [], [p.address], poll_s=0.05)
        await source.start()
        h = hash_block_tokens(list(range(32)), 16)
        p.log.record_stored(h)
        await until(lambda: view.kv_index.overlap(h) == {"p1": 2})
        await p.stop()  # the process dies; a new one (empty cache) takes the same address
        p = _Worker(replace(p.info, epoch=2), port=p.port)
        await p.start()
        await until(lambda: getattr(view.member("p1"), "epoch", 0) == 2, what="the new epoch")
        await until(lambda: view.kv_index.overlap(h) == {}, what="the old cache to be gone")
        channel = grpc.aio.insecure_channel(p.address)
        assert (await WorkerControlClient(channel).info()).epoch == 2
        await channel.close()
        await source.close()
        await p.stop()

    run(main)


def test_a_worker_listed_in_the_wrong_role_is_refused() -> None:
    async def main() -> None:
        d = _Worker(info("d1"))
        await d.start()
        view = ClusterView(FP)
        source = StaticClusterSource(view, [], [d.address], poll_s=0.05)
        await source.start()
        await asyncio.sleep(0.2)
        assert view.members() == []
        await source.close()
        await d.stop()

    run(main)


def test_worker_control_plane_reports_engine_cache_and_drain() -> None:
    from control_plane.worker_side import WorkerControlPlane
    from engine.block_manager import BlockManager

    async def main() -> None:
        plane = WorkerControlPlane(info("p1", role="prefill"), lambda: LoadSample(100, 100, 0, 0))
        server = grpc.aio.server()
        control_pb2_grpc.add_WorkerControlServicer_to_server(plane.servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await plane.start()
        view = ClusterView(FP)
        source = StaticClusterSource(view, [], [f"127.0.0.1:{port}"], poll_s=0.05, relist_s=0.1)
        await source.start()
        bm = BlockManager(16, 16)
        bm.enable_kv_events()
        tokens = list(range(64))
        h = hash_block_tokens(tokens, 16)
        bm.allocate("r", 64)
        bm.cache_blocks("r", h, 64)
        bm.free("r")
        plane.on_engine_step(bm)  # what the engine thread does after a step
        await until(lambda: view.kv_index.overlap(h) == {"p1": 4}, what="the engine's cache")
        bm.allocate("big", 16 * 16)  # reuses every free block: all four hashes evicted
        plane.on_engine_step(bm)
        await until(lambda: view.kv_index.overlap(h) == {}, what="the evictions")
        assert [m.worker_id for m in view.routable("prefill")] == ["p1"]
        await plane.drain()
        await until(lambda: not view.routable("prefill"), what="the drain")
        await source.close()
        await plane.stop()
        await server.stop(0)

    run(main)
