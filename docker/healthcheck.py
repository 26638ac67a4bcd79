"""The images' HEALTHCHECK: is this container's pdserve process serving?

Reads the command line of the container's main process (PID 1, or --pid), finds the pdserve
role (serve, router, prefill, decode) and its gRPC address, and asks grpc.health.v1 for the
overall status (service ""). Exit 0 when SERVING, 1 otherwise. Kubernetes ignores HEALTHCHECK
(the chart declares its own probes); this is for `docker run` and compose.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Each role's gRPC port flag and default, as pdserve's parsers define them.
GRPC_PORT = {
    "serve": ("--grpc-port", 50051),
    "router": ("--grpc-port", 50051),
    "prefill": ("--port", 50071),
    "decode": ("--port", 50061),
}


def _value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def target_of(cmdline: list[str]) -> str:
    """host:port of the gRPC server that ``cmdline`` (a pdserve process) listens on."""
    starts = [i for i, a in enumerate(cmdline) if Path(a).name == "pdserve"]
    if not starts:
        raise ValueError(f"not a pdserve process: {cmdline}")
    args = cmdline[starts[0] + 1 :]
    role = args[0] if args else ""
    if role not in GRPC_PORT:
        raise ValueError(f"pdserve {role!r} serves no gRPC health")
    flag, default = GRPC_PORT[role]
    port = _value(args, flag) or str(default)
    host = _value(args, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pid", type=int, default=1, help="the pdserve process (default 1)")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    a = parser.parse_args(argv)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    raw = Path(f"/proc/{a.pid}/cmdline").read_bytes()
    target = target_of([p.decode() for p in raw.split(b"\0") if p])
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=a.timeout_s
            )
        except grpc.RpcError as e:
            print(f"{target}: {e.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{target}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
