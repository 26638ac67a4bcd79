"""The router's flags (``pdserve serve`` and ``pdserve router``) and the ``ServerOptions`` they
make, checked before a model loads or a worker starts."""

from __future__ import annotations

import argparse
from typing import Any


def router_options(a: argparse.Namespace) -> Any:
    """The router's ``ServerOptions`` from its flags; ValueError names a bad one."""
    from router.grpc_connections import GrpcConnectionPolicy
    from router.security import RouterSecurity
    from router.server import ServerOptions

    if a.max_queue < 1:
        raise ValueError(f"--max-queue must be at least 1, got {a.max_queue}")
    for flag, value in (
        ("--sse-keepalive-s", a.sse_keepalive_s),
        ("--http-keepalive-s", a.http_keepalive_s),
    ):
        if not 0 <= value <= 86400:
            raise ValueError(f"{flag} must be between 0 and 86400, got {value}")
    return ServerOptions(
        security=RouterSecurity.from_args(a),
        grpc_connections=GrpcConnectionPolicy(
            a.grpc_keepalive_s,
            a.grpc_keepalive_timeout_s,
            a.grpc_min_client_ping_s,
            a.grpc_max_connection_age_s,
        ),
        host=a.host,
        grpc_port=a.grpc_port,
        http_port=a.http_port,
        max_queue=a.max_queue,
        sse_keepalive_s=a.sse_keepalive_s,
        http_keepalive_s=a.http_keepalive_s,
        retry_after_s=a.retry_after_s,
        shutdown_grace_s=a.shutdown_grace_s,
    )


def add_router_args(p: argparse.ArgumentParser) -> None:
    api = p.add_argument_group("router")
    api.add_argument("--host", default="127.0.0.1", help="address both servers listen on")
    api.add_argument("--grpc-port", type=int, default=50051, help="0 = any free port")
    api.add_argument("--http-port", type=int, default=8000, help="0 = any free port")
    api.add_argument(
        "--grpc-keepalive-s",
        type=float,
        default=60.0,
        help="ping a gRPC client whose connection has been quiet this long (0 = never); one "
        "that does not answer within --grpc-keepalive-timeout-s is disconnected and its "
        "requests cancelled",
    )
    api.add_argument(
        "--grpc-keepalive-timeout-s",
        type=float,
        default=20.0,
        help="how long the server waits for the answer to its keepalive ping",
    )
    api.add_argument(
        "--grpc-min-client-ping-s",
        type=float,
        default=5.0,
        help="accept a gRPC client's keepalive pings this often, also while its call waits "
        "silently for a first token (gRPC's default, 5 minutes, disconnects a client pinging "
        "every 10-30 s with GOAWAY too_many_pings)",
    )
    api.add_argument(
        "--grpc-max-connection-age-s",
        type=float,
        default=1800.0,
        help="send GOAWAY on a gRPC connection this old (0 = never): the client reconnects for "
        "its next calls, so behind a Kubernetes Service clients spread over router replicas "
        "the autoscaler adds; calls in flight finish on the old connection",
    )
    api.add_argument(
        "--http-keepalive-s",
        type=int,
        default=75,
        help="keep an idle HTTP connection open this long; above the idle timeout of the "
        "load balancer in front (60 s for AWS ALB and nginx; 620 s behind Google's), which "
        "otherwise reuses a connection the server is closing and answers 502",
    )
    api.add_argument(
        "--sse-keepalive-s",
        type=float,
        default=0.0,
        help="send an SSE comment line (': keep-alive') on a stream silent this long, e.g. "
        "queued before its first token, so a proxy with an idle timeout (60 s for "
        "ingress-nginx and AWS ALB) keeps it open (0 = never, the default: vLLM's `vllm bench "
        "serve` client mis-parses SSE comments and fails the request; the openai SDK skips them)",
    )
    api.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests in flight before new ones get HTTP 429 / RESOURCE_EXHAUSTED",
    )
    api.add_argument("--retry-after-s", type=float, default=1.0, help="retry hint when busy")
    api.add_argument(
        "--served-model-name",
        action="append",
        default=None,
        help="a name clients use for the model (repeat for aliases; the first is the primary; "
        "the --model path is accepted too); default: the model folder name",
    )
    api.add_argument(
        "--chat-template",
        default=None,
        help="render chats with this Jinja template instead of the tokenizer's (a file, or "
        "the template text itself), e.g. for a model whose tokenizer has none",
    )
    api.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=5.0,
        help="on SIGTERM/Ctrl-C, requests in flight get this long to finish (then a clear "
        "error); new ones are refused at once",
    )
    api.add_argument(
        "--stall-timeout-s",
        type=float,
        default=10.0,
        help="fail a request whose decode worker sends neither a token nor a heartbeat "
        "(every --heartbeat-s, 1 s by default) for this long",
    )
    api.add_argument(
        "--migration-limit",
        type=int,
        default=3,
        help="a request whose worker dies, stalls or drains moves to another worker, with no "
        "token lost or repeated, at most this many times (0 = fail it instead)",
    )
    api.add_argument(
        "--local-prefill-max-tokens",
        type=int,
        default=0,
        help="decode prefills prompts up to this length itself (0 = always remote)",
    )
    from router.security import add_security_args

    add_security_args(p)
    slo = p.add_argument_group("SLOs (goodput and SLO-violation metrics)")
    slo.add_argument("--slo-ttft-ms", type=float, default=None, help="time-to-first-token SLO")
    slo.add_argument(
        "--slo-itl-ms", type=float, default=None, help="inter-token latency (time per token) SLO"
    )
