"""A worker process's part in the control plane: its identity, and the
``WorkerControlPlane`` that serves ``WorkerControl`` next to the worker's own gRPC service and,
given ``--redis-url``, keeps it registered in Redis.

    a = parse(...)                         pdserve.worker_control_args added the flags
    plane = worker_control_plane(a, "decode", engine, lambda: aengine.stats, address, ...)
    AsyncEngine(engine, on_step=plane.on_engine_step)
    servicer on the gRPC server: add_WorkerControlServicer_to_server(plane.servicer, server)
    await plane.start()  ...  await plane.drain()  ...  await plane.stop()
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from control_plane.worker_agent import LoadSample
from control_plane.worker_info import ModelFingerprint, WorkerInfo, WorkerRole
from control_plane.worker_side import WorkerControlPlane, new_worker_id
from engine.engine_stats import EngineStats
from engine.llm_engine import LLMEngine
from engine.metrics import HistogramSnapshot
from pdserve.worker_control_args import heartbeat_of, redis_url_of


def worker_control_plane(
    a: argparse.Namespace,
    role: WorkerRole,
    engine: LLMEngine,
    stats: Callable[[], EngineStats],
    grpc_address: str,
    model_name: str,
    queued_prefill_tokens: Callable[[], int] = lambda: 0,
    kv_endpoint: str = "",
    transport: str = "",
    on_fenced: Callable[[], None] | None = None,
) -> WorkerControlPlane:
    """The control plane of a worker serving ``engine`` at ``grpc_address``. ``stats``:
    the engine's latest published stats (``AsyncEngine.stats``; read on the event loop)."""
    spec = engine.kv_spec
    identity = WorkerInfo(
        worker_id=a.worker_id or new_worker_id(role),
        role=role,
        grpc_address=grpc_address,
        fingerprint=ModelFingerprint(
            model=model_name,
            architecture=engine.model_config.architecture,
            dtype=spec.dtype,
            block_size=spec.block_size,
            num_layers=spec.num_layers,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
        ),
        num_blocks=engine.block_manager.num_blocks,
        kv_endpoint=kv_endpoint,
        transport=transport,
    )
    caching = engine.config.enable_prefix_caching
    if caching:
        engine.block_manager.enable_kv_events()
    step_time = _StepTime(engine)

    def sample_load() -> LoadSample:
        s = stats()
        return LoadSample(
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            num_running_requests=s.num_running + s.num_swapped,
            num_waiting_requests=s.num_waiting + s.num_waiting_for_remote_kv,
            num_queued_prefill_tokens=queued_prefill_tokens(),
            step_time_s=step_time(),
        )

    heartbeat_s = heartbeat_of(a)
    return WorkerControlPlane(
        identity,
        sample_load,
        redis_url=redis_url_of(a),
        cluster=a.cluster_name,
        lease_s=a.registry_lease_s,
        heartbeat_s=heartbeat_s,
        on_fenced=on_fenced,
        kv_events=caching,
    )


class _StepTime:
    """The mean step time since the last sample (the last mean when no step ran since)."""

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self._last: HistogramSnapshot | None = None
        self._mean = 0.0

    def __call__(self) -> float:
        now = self._engine.metrics.step_seconds.snapshot()
        if self._last is not None and now.count > self._last.count:
            self._mean = (now.sum - self._last.sum) / (now.count - self._last.count)
        elif self._last is None and now.count:
            self._mean = now.sum / now.count
        self._last = now
        return self._mean
