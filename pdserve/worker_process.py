"""What both worker processes (prefill and decode) share: their common flags, process set-up,
the gRPC server with grpc.health.v1, running until SIGINT/SIGTERM, and draining after it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.fast_exit import exit_now
from pdserve.options import add_engine_args
from pdserve.tls import EXCLUSIVE_PORT, MESSAGE_OPTIONS, ServerTls, add_port
from pdserve.worker_control_args import add_control_args
from pdserve.worker_security import add_tls_args

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine
    from engine.engine_config import EngineConfig
    from engine.kv_connector.base import KVConnector
    from engine.llm_engine import LLMEngine


def add_worker_args(p: argparse.ArgumentParser, default_port: int) -> None:
    """``--host/--port/--metrics-port/--served-model-name`` plus every engine flag."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port)
    p.add_argument(
        "--metrics-port", type=int, default=0, help="Prometheus /metrics (0 = free port, -1 = off)"
    )
    p.add_argument("--served-model-name", default=None, help="the metrics' model label")
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=5.0,
        help="on SIGTERM, requests in flight get this long to finish (then UNAVAILABLE)",
    )
    add_tls_args(p)
    add_engine_args(p)
    add_control_args(p)


def metrics_port_of(a: argparse.Namespace) -> int | None:
    return None if a.metrics_port < 0 else int(a.metrics_port)


def prepare_worker_process() -> None:
    """Call before anything imports ucxx."""
    # ucxx without Python futures awaits every pending receive with a sleep(0) polling loop:
    # an idle worker burnt 50-100% of a core. With them (one event loop per process, as here)
    # an idle worker uses ~2%.
    os.environ.setdefault("UCXPY_ENABLE_PYTHON_FUTURE", "1")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def build_engine(config: EngineConfig, connector: KVConnector) -> LLMEngine:
    """The worker's engine. A configuration it cannot take (``max_model_len`` past the model's
    positions, ``max_num_seqs`` 0, a model folder without weights ...) ends the process with
    one line and exit status 2, as ``pdserve serve --colocated`` ends on the same error, not with
    a traceback."""
    from engine.llm_engine import LLMEngine

    try:
        return LLMEngine(config, kv_connector=connector)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def run_worker(serve: Coroutine[Any, Any, None]) -> int:
    """Run a worker's ``serve`` to its end and exit. An address it cannot take (an OSError
    naming it, e.g. a port in use) is one ``error:`` line and exit status 1, as the router's."""
    try:
        asyncio.run(serve)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        exit_now(1)
    exit_now(0)
    return 0


async def start_grpc_server(
    add_servicer: Any,
    servicer: Any,
    service_name: str,
    host: str,
    port: int,
    tls: ServerTls | None = None,
    extra: Sequence[tuple[Any, Any]] = (),
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Serve ``servicer`` (and each ``(add_servicer, servicer)`` of ``extra``) and
    grpc.health.v1 (SERVING for "" and ``service_name``) on ``host:port`` (0 = any free
    port); returns the server, its bound port and the health servicer (``drain`` turns it
    NOT_SERVING). ``tls``: the port speaks only (mutual) TLS."""
    # Messages as large as the router let in; the port alone.
    server = grpc.aio.server(options=[*MESSAGE_OPTIONS, EXCLUSIVE_PORT])
    add_servicer(servicer, server)
    for add, other in extra:
        add(other, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = add_port(server, f"{host}:{port}", tls)
    await server.start()
    for name in ("", service_name):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound, health_servicer


class RequestFailed(Exception):
    """How a handler inside ``Drain.serving`` fails its request: ``serving`` lets go of the
    request first (the handler's own cleanup has run by then: its engine request aborted, its
    connector job gone) and only then sends the status. ``context.abort`` sends the status
    before it raises, so a client retrying at once with the same id could be told the request
    is still in flight here."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Drain:
    """The requests a worker serves, and its shutdown in two steps.

    ``begin``: draining — the role's health service says NOT_SERVING (``""`` stays
    SERVING), GetLoad says ``draining``, new requests
    are refused with UNAVAILABLE (unless ``serving`` admits them while draining: a prefill
    for a request the cluster already started). ``stop_all`` (at the grace): every request
    still in flight ends now with UNAVAILABLE and a message saying why. On the event loop.
    """

    def __init__(self, who: str) -> None:
        self.who = who
        self.is_draining = False
        self.is_stopping = False
        self.handover = False  # stop_all hands the requests over to migration (decode)
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def message(self) -> str:
        if self.handover:
            return (
                f"the {self.who} is shutting down (draining): it hands the request over to "
                "another worker (--drain-migrate-after-s)"
            )
        return f"the {self.who} is shutting down: the request did not finish within its grace"

    @property
    def num_in_flight(self) -> int:
        return len(self._tasks)

    @asynccontextmanager
    async def serving(
        self,
        request_id: str,
        context: grpc.aio.ServicerContext,
        admit_while_draining: bool = False,
    ) -> AsyncIterator[None]:
        """Around one request's handler: refuses it when draining or when ``request_id`` is
        already in flight here (INVALID_ARGUMENT: cleanup must never touch another's). The
        handler fails its request by raising ``RequestFailed``, not by ``context.abort``."""
        if self.is_stopping or (self.is_draining and not admit_while_draining):
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the {self.who} is shutting down")
        if request_id in self._tasks:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request_id {request_id!r} is already in flight on this {self.who}",
            )
        task = asyncio.current_task()
        assert task is not None
        self._tasks[request_id] = task
        self._idle.clear()
        failure: RequestFailed | None = None
        try:
            yield
        except RequestFailed as e:
            failure = e
        except asyncio.CancelledError:
            if not self.is_stopping:
                raise  # the caller cancelled: nobody to tell
            task.uncancel()
            failure = RequestFailed(grpc.StatusCode.UNAVAILABLE, self.message)
        finally:
            del self._tasks[request_id]
            if not self._tasks:
                self._idle.set()
        if failure is not None:
            await context.abort(failure.code, failure.message)  # the id is free by now

    async def begin(self, health_servicer: health.aio.HealthServicer, service_name: str) -> None:
        """``service_name`` (the role's readiness service) turns NOT_SERVING: the Service
        stops sending work. ``""`` (liveness) stays SERVING: the process is healthy and
        finishing what it holds, and must not be restarted for it."""
        self.is_draining = True
        await health_servicer.set(service_name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is in flight; False when ``timeout_s`` passed first."""
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def stop_all(self) -> None:
        self.is_stopping = True
        for task in self._tasks.values():
            task.cancel()


async def drain(
    drain: Drain,
    health_servicer: health.aio.HealthServicer,
    service_name: str,
    grace_s: float,
    migrate_after_s: float | None = None,
) -> None:
    """Drain a worker: ``service_name`` NOT_SERVING now, ``grace_s`` for what is in flight,
    then stop it. ``migrate_after_s`` (decode): stop what is left this soon instead (at most
    ``grace_s``), with a message telling the router to migrate it to another worker."""
    wait_s = grace_s
    if migrate_after_s is not None:
        wait_s = min(grace_s, migrate_after_s)
        drain.handover = True
    await drain.begin(health_servicer, service_name)
    if not await drain.wait_idle(wait_s):
        logging.getLogger(__name__).warning(
            "%d requests still in flight after %.1fs: %s",
            drain.num_in_flight,
            wait_s,
            "handing them over to migration" if drain.handover else "stopping them",
        )
        drain.stop_all()
        await drain.wait_idle(1.0)


async def wait_for_stop_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def integrity_error(engine: AsyncEngine, *checks: Callable[[], None]) -> str:
    """Run the engine's ``check_integrity`` on its thread, then each of ``checks`` here; the
    first broken invariant's message, or "" when all hold (``GetLoad(check_integrity)``)."""
    try:
        await engine.call(lambda e: e.check_integrity())
        for check in checks:
            check()
    except AssertionError as e:
        return f"integrity check failed: {e}" if str(e) else "integrity check failed"
    return ""
