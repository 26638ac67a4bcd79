"""The registry of a prefill or decode worker: its engine, TTFT stages, KV transfer and its
side of the control plane."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector

from engine.async_engine import AsyncEngine
from engine.metrics import Histogram
from kv_transfer.metrics import TransferMetrics
from pdserve.metrics.build_info import BuildInfo, engine_labels
from pdserve.metrics.engine_collector import EngineCollector
from pdserve.metrics.stages import TtftStages
from pdserve.metrics.transfer_collector import TransferCollector

if TYPE_CHECKING:
    from control_plane.worker_side import WorkerControlPlane


def worker_registry(
    engine: AsyncEngine,
    role: str,
    model: str,
    transfer: TransferMetrics,
    transport: str,
    stages: dict[str, Histogram],
    control: WorkerControlPlane | None = None,
) -> CollectorRegistry:
    """``role`` is "prefill" (the transfer's sending side) or "decode" (receiving side);
    ``stages`` adds the service's own TTFT stages to the engine's queue and compute."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(EngineCollector(engine, role, model))
    BuildInfo(registry, role, model).add(engine_labels(engine))
    ttft = TtftStages(role, model)
    metrics = engine.metrics
    ttft.add("prefill_queue", metrics.queue_seconds)
    ttft.add("prefill_compute", metrics.prefill_seconds)
    for stage, histogram in stages.items():
        ttft.add(stage, histogram)
    registry.register(ttft)
    side = "send" if role == "prefill" else "receive"
    registry.register(TransferCollector(transfer, role, model, transport, side))
    if control is not None:
        from pdserve.metrics.control_plane_collector import WorkerControlPlaneCollector

        registry.register(
            WorkerControlPlaneCollector(control.stats, lambda: control.is_registered, role, model)
        )
    return registry
