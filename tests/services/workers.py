"""Start real prefill/decode worker processes on loopback for the tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(target: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise TimeoutError(f"{target} not healthy within {timeout_s}s")


@contextmanager
def start_worker(role: str, model: Path, *args: str) -> Iterator[str]:
    """Run ``python -m {role}_service`` and yield its gRPC target; stop it afterwards."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        f"{role}_service",
        "--port",
        str(port),
        "--model",
        str(model),
        "--dtype",
        "float32",
        "--num-kv-blocks",
        "128",
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO)
    target = f"127.0.0.1:{port}"
    try:
        wait_healthy(target, proc)
        yield target
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
