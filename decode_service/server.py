"""Run a decode worker: ``python -m decode_service --port 50061 --model ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from decode_service.heartbeat import HEARTBEAT_S
from decode_service.service import DecodeWorkerService
from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from kv_transfer import create_receiver, release_transports, resolve_transport
from kv_transfer.decode_connector import DecodeConnector
from kv_transfer.receiver import DEFAULT_LEASE_S
from pdserve.metrics.http import MetricsServer
from pdserve.metrics.worker import worker_registry
from pdserve.options import engine_config_from_args
from pdserve.tls import CertificateWatch
from pdserve.worker_control import worker_control_plane
from pdserve.worker_control_args import advertised_address, control_defaults
from pdserve.worker_process import (
    add_worker_args,
    build_engine,
    drain,
    metrics_port_of,
    prepare_worker_process,
    run_worker,
    start_grpc_server,
    wait_for_stop_signal,
)
from pdserve.worker_security import NO_SECURITY, WorkerSecurity
from protos.pdserve.v1 import control_pb2_grpc, worker_pb2_grpc

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
    kv_lease_s: float = DEFAULT_LEASE_S,
    shutdown_grace_s: float = 5.0,
    heartbeat_s: float = HEARTBEAT_S,
    control: argparse.Namespace | None = None,
    security: WorkerSecurity = NO_SECURITY,
    drain_migrate_after_s: float | None = None,
) -> None:
    """``metrics_port``: serve Prometheus ``/metrics`` there (0 = any free port, printed;
    None = off). ``model_name``: the ``model`` label (default: the model folder's name).
    ``kv_lease_s``: how long a reservation lives without a write or a renewal from prefill.
    ``heartbeat_s``: a quiet stream sends a heartbeat this often (the router's stall timeout
    must be well above it). ``control``: the control-plane flags (pdserve.worker_control_args;
    default: no Redis). On SIGINT/SIGTERM it drains: unregistered and NOT_SERVING at once,
    new requests refused, those in flight get ``shutdown_grace_s``, then end with
    UNAVAILABLE; ``drain_migrate_after_s``: end them this soon (at most the grace) with a
    message the router answers by migrating them to another decode worker.
    ``security``: mutual TLS on the gRPC port and the KV listener."""
    control = control or control_defaults(host)
    connector = DecodeConnector(config.block_size)
    engine = build_engine(config, connector)
    kind = resolve_transport(security.kv_transport(transport))
    certificates = CertificateWatch()
    receiver = create_receiver(
        engine.kv_spec,
        engine.kv_cache.pool,
        connector,
        kind,
        host=kv_host,
        port=kv_port,
        default_lease_s=kv_lease_s,
        ssl_context=security.kv_server_context(certificates),
    )
    await receiver.start()
    connector.attach(receiver)
    name = model_name or Path(engine.model_config.path).name
    plane = worker_control_plane(
        control, "decode", engine, lambda: aengine.stats, "", name, transport=kind
    )
    aengine = AsyncEngine(engine, on_step=plane.on_step)
    servicer = DecodeWorkerService(aengine, connector, receiver, kind, heartbeat_s)
    server, bound, health = await start_grpc_server(
        worker_pb2_grpc.add_DecodeWorkerServicer_to_server,
        servicer,
        SERVICE_NAME,
        host,
        port,
        security.server,
        extra=[(control_pb2_grpc.add_WorkerControlServicer_to_server, plane.servicer)],
    )
    reload_task = asyncio.create_task(certificates.run())
    plane.bind(advertised_address(control, bound), receiver.endpoint)
    await plane.start()
    print(f"decode worker: grpc {host}:{bound}, kv {receiver.endpoint} ({kind})", flush=True)
    metrics = None
    if metrics_port is not None:
        registry = worker_registry(
            aengine,
            "decode",
            name,
            receiver.metrics,
            kind,
            {"decode_admission": servicer.admission_seconds},
            plane,
        )
        metrics = MetricsServer(registry, host, metrics_port)
        print(f"decode worker: metrics {metrics.url}", flush=True)
    await wait_for_stop_signal()
    await plane.drain()  # unregister first: routers stop sending, then finish in-flight work
    await drain(servicer.drain, health, SERVICE_NAME, shutdown_grace_s, drain_migrate_after_s)
    reload_task.cancel()
    # Drained: nothing is left to finish. The metrics thread stops at its next poll (0.5 s).
    closing = asyncio.ensure_future(asyncio.to_thread(metrics.close)) if metrics else None
    await server.stop(grace=0.5)
    await plane.stop()
    await receiver.close()
    await release_transports()
    await asyncio.to_thread(aengine.shutdown)
    if closing is not None:
        await closing


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pdserve decode", description="run a decode worker")
    add_worker_args(p, default_port=50061)
    p.add_argument("--kv-transport", default="auto", help="auto | ucx | tcp")
    p.add_argument("--kv-host", default="127.0.0.1")
    p.add_argument("--kv-port", type=int, default=0)
    p.add_argument(
        "--kv-lease-s",
        type=float,
        default=DEFAULT_LEASE_S,
        help="a reservation is released when prefill neither writes nor renews it for this long",
    )
    p.add_argument(
        "--heartbeat-s",
        type=float,
        default=HEARTBEAT_S,
        help="a stream with nothing to send sends a heartbeat this often (keep the router's "
        "--stall-timeout-s well above it)",
    )
    p.add_argument(
        "--drain-migrate-after-s",
        type=float,
        default=None,
        help="on SIGTERM, hand the requests still in flight this long after it to the router, "
        "which migrates them to another decode worker (default: --shutdown-grace-s; they are "
        "handed over at the grace either way)",
    )
    a = p.parse_args(argv)
    if a.drain_migrate_after_s is not None and a.drain_migrate_after_s < 0:
        p.error(f"--drain-migrate-after-s must be >= 0, got {a.drain_migrate_after_s}")
    for flag in ("kv_lease_s", "heartbeat_s"):
        if getattr(a, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(a, flag)}")
    prepare_worker_process()
    config = engine_config_from_args(a)
    try:
        security = WorkerSecurity.from_args(a)
        security.kv_transport(a.kv_transport)
    except ValueError as e:
        p.error(str(e))
    return run_worker(
        serve(
            config,
            a.host,
            a.port,
            a.kv_transport,
            a.kv_host,
            a.kv_port,
            metrics_port_of(a),
            a.served_model_name,
            a.kv_lease_s,
            a.shutdown_grace_s,
            a.heartbeat_s,
            a,
            security,
            a.drain_migrate_after_s,
        )
    )
