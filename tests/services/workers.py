"""Start real prefill/decode worker processes on loopback for the tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pdserve.launch import wait_healthy

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        wait_healthy(target, proc, 120.0)
        yield target
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
