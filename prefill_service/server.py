"""Run a prefill worker: ``python -m prefill_service --port 50071 --model ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from kv_transfer import KVSender
from prefill_service.service import PrefillWorkerService, ProgressRouter
from protos.pdserve.v1 import worker_pb2_grpc

logger = logging.getLogger(__name__)
SERVICE_NAME = "pdserve.v1.PrefillWorker"


async def serve(config: EngineConfig, host: str, port: int) -> None:
    engine = LLMEngine(config)
    progress = ProgressRouter()
    aengine = AsyncEngine(engine, on_step=progress.on_step)
    sender = KVSender(engine.kv_spec, engine.kv_cache.pool)
    server = grpc.aio.server()
    worker_pb2_grpc.add_PrefillWorkerServicer_to_server(
        PrefillWorkerService(aengine, progress, sender), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    print(f"prefill worker: grpc {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=2.0)
    await sender.close()
    await asyncio.to_thread(aengine.shutdown)


def main(argv: Sequence[str] | None = None) -> int:
    from pdserve.cli import add_engine_args, engine_options

    p = argparse.ArgumentParser(prog="pdserve prefill", description="run a prefill worker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50071)
    add_engine_args(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = EngineConfig(model=a.model, **engine_options(a))
    asyncio.run(serve(config, a.host, a.port))
    return 0
