"""Run the router's gRPC and HTTP servers on one event loop until asked to stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import uvicorn

from router.admission import Admission
from router.backend import Backend
from router.grpc_connections import GrpcConnectionPolicy
from router.grpc_server import GrpcServer
from router.metrics import RouterMetrics
from router.openai_http import build_app
from router.request_id_http import RequestIdHeader
from router.security import RouterGuard, RouterSecurity
from router.service import Router

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    grpc_port: int = 50051  # 0 = any free port (the chosen one is printed)
    http_port: int = 8000
    max_queue: int = 256  # requests in flight through the router before 429/RESOURCE_EXHAUSTED
    retry_after_s: float = 1.0
    shutdown_grace_s: float = 5.0
    security: RouterSecurity = field(default_factory=RouterSecurity)  # keys, TLS
    grpc_connections: GrpcConnectionPolicy = field(default_factory=GrpcConnectionPolicy)
    sse_keepalive_s: float = 0.0  # an SSE comment after this long without an event (0: never)
    # An idle HTTP connection is kept this long (uvicorn's default, 5 s, is below the idle
    # timeout of the load balancers in front: they reuse a connection the server is closing
    # and answer 502).
    http_keepalive_s: int = 75


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: ``serve_router`` owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


# TCP keepalive on every HTTP connection (accepted sockets inherit it from the listener): a
# client whose host is gone (crashed, cut off) sends no FIN, so without it its queued request
# waited for its turn and ran to its last token; now the kernel drops the connection after 60 s
# idle and 3 unanswered probes 10 s apart, and the request is aborted on the disconnect.
# (gRPC has its own pings: router/grpc_connections.py.)
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 60, 10, 3


def _tcp_keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's own timers
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _tcp_keepalive(sock)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen for HTTP on {_hostport(host, port)}: {e.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_router(
    backend: Backend,
    options: ServerOptions,
    on_ready: Callable[[str, str], None] | None = None,
    metrics: RouterMetrics | None = None,
    on_drained: Callable[[], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then drain: gRPC health NOT_SERVING and HTTP /health 503
    at once, new requests refused (503 / UNAVAILABLE), requests in flight given
    ``options.shutdown_grace_s`` to finish and then failed with a clear error; then stop both
    servers and close the backend.

    ``on_ready(grpc_address, http_url)`` is called once both servers listen; ``on_drained()``
    once no request is left in flight (``pdserve serve`` then stops its workers while the
    servers stop). ``metrics`` (default: role "router", no SLOs) is served at ``/metrics``.
    """
    await backend.start()
    router = Router(backend, Admission(options.max_queue, options.retry_after_s), metrics)
    security = options.security
    guard = RouterGuard(
        security, router.metrics.registry, router.metrics.role, router.metrics.model
    )
    grpc_server = GrpcServer(
        router,
        _hostport(options.host, options.grpc_port),
        guard.grpc_interceptors(),
        security.tls,
        options.grpc_connections,
    )
    sock = _listen(options.host, options.http_port)
    http_port = sock.getsockname()[1]
    http = _Uvicorn(
        uvicorn.Config(
            guard.wrap_http(RequestIdHeader(build_app(router, options.sse_keepalive_s))),
            log_level="warning",
            lifespan="off",
            # Drained before uvicorn is told to stop: what is left are idle connections.
            timeout_graceful_shutdown=1,
            timeout_keep_alive=options.http_keepalive_s,
            **guard.uvicorn_tls(),
        )
    )
    http.config.load()  # builds its SSLContext, which the guard reloads on rotation
    guard.watch_http_context(http.config.ssl)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, guard.reload_keys)
    guard_task = asyncio.create_task(guard.run())
    await grpc_server.start()
    http_task = asyncio.create_task(http.serve(sockets=[sock]))
    try:
        while not http.started:
            if http_task.done():
                await http_task  # raises what stopped it
                raise RuntimeError("the HTTP server stopped during startup")
            await asyncio.sleep(0.01)
        if on_ready is not None:
            on_ready(
                _hostport(options.host, grpc_server.port),
                f"{security.scheme}://{_hostport(options.host, http_port)}",
            )
        stop_wait = asyncio.create_task(stop.wait())
        await asyncio.wait({stop_wait, http_task}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
    finally:
        guard_task.cancel()
        logger.info("draining for up to %.1fs", options.shutdown_grace_s)
        router.begin_drain(options.shutdown_grace_s)
        await grpc_server.health.enter_graceful_shutdown()
        # Each request in flight ends by the grace (its stream gets the error by then).
        await router.wait_idle(options.shutdown_grace_s + 1.0)
        if on_drained is not None:
            on_drained()
        http.should_exit = True
        await asyncio.gather(grpc_server.stop(0.5), http_task, return_exceptions=True)
        await backend.close()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
