"""The registry of a prefill or decode worker: its engine, TTFT stages and KV transfer."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector

from engine.async_engine import AsyncEngine
from engine.metrics import Histogram
from kv_transfer.metrics import TransferMetrics
from pdserve.metrics.engine_collector import EngineCollector
from pdserve.metrics.stages import TtftStages
from pdserve.metrics.transfer_collector import TransferCollector


def worker_registry(
    engine: AsyncEngine,
    role: str,
    model: str,
    transfer: TransferMetrics,
    transport: str,
    stages: dict[str, Histogram],
) -> CollectorRegistry:
    """``role`` is "prefill" (the transfer's sending side) or "decode" (receiving side);
    ``stages`` adds the service's own TTFT stages to the engine's queue and compute."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(EngineCollector(engine, role, model))
    ttft = TtftStages(role, model)
    metrics = engine.metrics
    ttft.add("prefill_queue", metrics.queue_seconds)
    ttft.add("prefill_compute", metrics.prefill_seconds)
    for stage, histogram in stages.items():
        ttft.add(stage, histogram)
    registry.register(ttft)
    side = "send" if role == "prefill" else "receive"
    registry.register(TransferCollector(transfer, role, model, transport, side))
    return registry
