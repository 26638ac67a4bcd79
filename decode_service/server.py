"""Run a decode worker: ``python -m decode_service --port 50061 --model ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from decode_service.service import DecodeOwner, DecodeWorkerService
from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from kv_transfer import create_receiver, resolve_transport
from protos.pdserve.v1 import worker_pb2_grpc

logger = logging.getLogger(__name__)
SERVICE_NAME = "pdserve.v1.DecodeWorker"


async def serve(
    config: EngineConfig, host: str, port: int, transport: str, kv_host: str, kv_port: int
) -> None:
    engine = LLMEngine(config)
    owner = DecodeOwner()
    kind = resolve_transport(transport)
    receiver = create_receiver(
        engine.kv_spec, engine.kv_cache.pool, owner, kind, host=kv_host, port=kv_port
    )
    await receiver.start()
    aengine = AsyncEngine(engine)
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(
        DecodeWorkerService(aengine, receiver, owner, kind), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    print(f"decode worker: grpc {host}:{bound}, kv {receiver.endpoint} ({kind})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=2.0)
    await receiver.close()
    await asyncio.to_thread(aengine.shutdown)


def main(argv: Sequence[str] | None = None) -> int:
    from pdserve.cli import add_engine_args, engine_options

    p = argparse.ArgumentParser(prog="pdserve decode", description="run a decode worker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50061)
    p.add_argument("--kv-transport", default="auto", help="auto | ucx | tcp")
    p.add_argument("--kv-host", default="127.0.0.1")
    p.add_argument("--kv-port", type=int, default=0)
    add_engine_args(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = EngineConfig(model=a.model, **engine_options(a))
    asyncio.run(serve(config, a.host, a.port, a.kv_transport, a.kv_host, a.kv_port))
    return 0
