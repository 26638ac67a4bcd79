"""What both worker processes (prefill and decode) share: their common flags, process set-up,
the gRPC server with grpc.health.v1, and running until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.options import add_engine_args
from pdserve.tls import ServerTls, add_port
from pdserve.worker_security import add_tls_args


def add_worker_args(p: argparse.ArgumentParser, default_port: int) -> None:
    """``--host/--port/--metrics-port/--served-model-name`` plus every engine flag."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port)
    p.add_argument(
        "--metrics-port", type=int, default=0, help="Prometheus /metrics (0 = free port, -1 = off)"
    )
    p.add_argument("--served-model-name", default=None, help="the metrics' model label")
    add_tls_args(p)
    add_engine_args(p)


def metrics_port_of(a: argparse.Namespace) -> int | None:
    return None if a.metrics_port < 0 else int(a.metrics_port)


def prepare_worker_process() -> None:
    """Call before anything imports ucxx."""
    # ucxx without Python futures awaits every pending receive with a sleep(0) polling loop:
    # an idle worker burnt 50-100% of a core. With them (one event loop per process, as here)
    # an idle worker uses ~2%.
    os.environ.setdefault("UCXPY_ENABLE_PYTHON_FUTURE", "1")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


async def start_grpc_server(
    add_servicer: Any,
    servicer: Any,
    service_name: str,
    host: str,
    port: int,
    tls: ServerTls | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Serve ``servicer`` and grpc.health.v1 (SERVING for "" and ``service_name``) on
    ``host:port`` (0 = any free port); returns the server and its bound port. ``tls``: the
    port speaks only (mutual) TLS."""
    server = grpc.aio.server()
    add_servicer(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = add_port(server, f"{host}:{port}", tls)
    await server.start()
    for name in ("", service_name):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def wait_for_stop_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
