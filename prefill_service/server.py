"""Run a prefill worker: ``python -m prefill_service --port 50071 --model ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from kv_transfer import KVSender, release_transports
from kv_transfer.peers import RegisteredPeers
from kv_transfer.prefill_connector import PrefillConnector
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
from pdserve.worker_security import NO_SECURITY, WorkerSecurity, add_kv_peer_args
from prefill_service.service import PrefillWorkerService
from protos.pdserve.v1 import control_pb2_grpc, worker_pb2_grpc

logger = logging.getLogger(__name__)
SERVICE_NAME = "pdserve.v1.PrefillWorker"


async def serve(
    config: EngineConfig,
    host: str,
    port: int,
    metrics_port: int | None = 0,
    model_name: str | None = None,
    shutdown_grace_s: float = 5.0,
    kv_host: str = "127.0.0.1",
    control: argparse.Namespace | None = None,
    security: WorkerSecurity = NO_SECURITY,
) -> None:
    """``metrics_port``: serve Prometheus ``/metrics`` there (0 = any free port, printed;
    None = off). ``model_name``: the ``model`` label (default: the model folder's name).
    ``kv_host``: the interface of any KV transport listener (UCX connects back to one).
    On SIGINT/SIGTERM it drains: NOT_SERVING at once, prefills in flight (and those of
    requests already started) get ``shutdown_grace_s``, then end with UNAVAILABLE.
    ``control``: the control-plane flags (pdserve.worker_control_args; default: no Redis).
    ``security``: mutual TLS on the gRPC port and to decode's KV listeners; the KV peers
    tickets may name."""
    control = control or control_defaults(host)
    connector = PrefillConnector()
    engine = build_engine(config, connector)
    connector.watch_engine(lambda: engine.num_steps)  # renew leases only while it steps
    name = model_name or Path(engine.model_config.path).name
    plane = worker_control_plane(
        control,
        "prefill",
        engine,
        lambda: aengine.stats,
        "",
        name,
        queued_prefill_tokens=lambda: servicer.num_queued_tokens,
    )
    aengine = AsyncEngine(engine, on_step=plane.on_step)
    certificates = CertificateWatch()
    sender = KVSender(
        engine.kv_spec,
        engine.kv_cache.pool,
        connectors=security.kv_connectors(certificates),
        host=kv_host,
        # With a registry, tickets may name only registered decode workers (and the static
        # --kv-allowed-peers): a stranger cannot have this worker connect where it chooses.
        peers=(
            RegisteredPeers(lambda: plane.kv_endpoints("decode"), security.peers)
            if plane.has_registry and getattr(control, "kv_peers_from_registry", False)
            else security.peers
        ),
    )
    servicer = PrefillWorkerService(aengine, connector, sender)
    server, bound, health = await start_grpc_server(
        worker_pb2_grpc.add_PrefillWorkerServicer_to_server,
        servicer,
        SERVICE_NAME,
        host,
        port,
        security.server,
        extra=[(control_pb2_grpc.add_WorkerControlServicer_to_server, plane.servicer)],
    )
    reload_task = asyncio.create_task(certificates.run())
    plane.bind(advertised_address(control, bound))
    await plane.start()
    print(f"prefill worker: grpc {host}:{bound}", flush=True)
    metrics = None
    if metrics_port is not None:
        registry = worker_registry(
            aengine,
            "prefill",
            name,
            sender.metrics,
            "all",
            {"kv_transfer": servicer.kv_transfer_seconds},
            plane,
        )
        metrics = MetricsServer(registry, host, metrics_port)
        print(f"prefill worker: metrics {metrics.url}", flush=True)
    await wait_for_stop_signal()
    await plane.drain()  # unregister first: routers stop sending, then finish in-flight work
    await drain(servicer.drain, health, SERVICE_NAME, shutdown_grace_s)
    reload_task.cancel()
    # Drained: nothing is left to finish. The metrics thread stops at its next poll (0.5 s).
    closing = asyncio.ensure_future(asyncio.to_thread(metrics.close)) if metrics else None
    await server.stop(grace=0.5)
    await plane.stop()
    await sender.close()
    await release_transports()
    await asyncio.to_thread(aengine.shutdown)
    if closing is not None:
        await closing


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pdserve prefill", description="run a prefill worker")
    add_worker_args(p, default_port=50071)
    p.add_argument("--kv-host", default="127.0.0.1", help="interface of KV listeners (UCX)")
    add_kv_peer_args(p)
    a = p.parse_args(argv)
    prepare_worker_process()
    config = engine_config_from_args(a)
    try:
        security = WorkerSecurity.from_args(a)
    except ValueError as e:
        p.error(str(e))
    return run_worker(
        serve(
            config,
            a.host,
            a.port,
            metrics_port_of(a),
            a.served_model_name,
            a.shutdown_grace_s,
            a.kv_host,
            a,
            security,
        )
    )
