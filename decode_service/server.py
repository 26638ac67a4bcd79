"""Run a decode worker: ``python -m decode_service --port 50061 --model ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from decode_service.service import DecodeOwner, DecodeWorkerService
from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from kv_transfer import create_receiver, resolve_transport
from pdserve.metrics.http import MetricsServer
from pdserve.metrics.worker import worker_registry
from protos.pdserve.v1 import worker_pb2_grpc

logger = logging.getLogger(__name__)
SERVICE_NAME = "pdserve.v1.DecodeWorker"


async def serve(
    config: EngineConfig,
    host: str,
    port: int,
    transport: str,
    kv_host: str,
    kv_port: int,
    metrics_port: int | None = 0,
    model_name: str | None = None,
) -> None:
    """``metrics_port``: serve Prometheus ``/metrics`` there (0 = any free port, printed;
    None = off). ``model_name``: the ``model`` label (default: the model folder's name)."""
    engine = LLMEngine(config)
    owner = DecodeOwner()
    kind = resolve_transport(transport)
    receiver = create_receiver(
        engine.kv_spec, engine.kv_cache.pool, owner, kind, host=kv_host, port=kv_port
    )
    await receiver.start()
    aengine = AsyncEngine(engine)
    server = grpc.aio.server()
    servicer = DecodeWorkerService(aengine, receiver, owner, kind)
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    print(f"decode worker: grpc {host}:{bound}, kv {receiver.endpoint} ({kind})", flush=True)
    metrics = None
    if metrics_port is not None:
        registry = worker_registry(
            aengine,
            "decode",
            model_name or Path(engine.model_config.path).name,
            receiver.metrics,
            kind,
            {"decode_admission": servicer.admission_seconds},
        )
        metrics = MetricsServer(registry, host, metrics_port)
        print(f"decode worker: metrics {metrics.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if metrics is not None:
        metrics.close()
    await server.stop(grace=2.0)
    await receiver.close()
    await asyncio.to_thread(aengine.shutdown)


def main(argv: Sequence[str] | None = None) -> int:
    from pdserve.cli import add_engine_args, engine_options

    p = argparse.ArgumentParser(prog="pdserve decode", description="run a decode worker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50061)
    p.add_argument(
        "--metrics-port", type=int, default=0, help="Prometheus /metrics (0 = free port, -1 = off)"
    )
    p.add_argument("--served-model-name", default=None, help="the metrics' model label")
    p.add_argument("--kv-transport", default="auto", help="auto | ucx | tcp")
    p.add_argument("--kv-host", default="127.0.0.1")
    p.add_argument("--kv-port", type=int, default=0)
    add_engine_args(p)
    a = p.parse_args(argv)
    # ucxx without Python futures awaits every pending receive with a sleep(0) polling loop:
    # an idle worker burnt 50-100% of a core. With them (one event loop per process, as here)
    # an idle worker uses ~2%. Must be set before ucxx is imported.
    os.environ.setdefault("UCXPY_ENABLE_PYTHON_FUTURE", "1")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = EngineConfig(model=a.model, **engine_options(a))
    metrics_port = None if a.metrics_port < 0 else a.metrics_port
    asyncio.run(
        serve(
            config,
            a.host,
            a.port,
            a.kv_transport,
            a.kv_host,
            a.kv_port,
            metrics_port,
            a.served_model_name,
        )
    )
    return 0
