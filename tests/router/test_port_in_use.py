"""A port that another process holds stops a pdserve process with one line naming it, exit 1, no
traceback: ``pdserve serve`` (its gRPC or HTTP port) and each worker (its gRPC port). gRPC's bind
failure used to escape as a RuntimeError; and as gRPC sets SO_REUSEPORT by default, a second
gRPC server on a port another gRPC server held (a second ``pdserve serve`` left on the default
--grpc-port) bound it silently, the kernel splitting clients between two servers. The holder
here is a plain listening socket, and one with SO_REUSEPORT as a gRPC server's is."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.services.workers import REPO

pytestmark = pytest.mark.timeout(300)


@contextmanager
def _held_port(holder: str) -> Iterator[int]:
    with socket.socket() as held:
        if holder == "reuseport":
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield held.getsockname()[1]


def _refused(done: subprocess.CompletedProcess[str], name: str, port: int) -> None:
    assert done.returncode == 1, done.stderr
    assert f"error: cannot listen for {name} on 127.0.0.1:{port}: " in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


# The HTTP socket is pdserve's own, without SO_REUSEPORT: any holder is as a plain one.
@pytest.mark.parametrize(
    "api,holder", [("grpc", "plain"), ("grpc", "reuseport"), ("http", "plain")]
)
def test_a_port_in_use_is_one_clear_error(llama: Path, api: str, holder: str) -> None:
    with _held_port(holder) as port:
        ports = {"grpc": "0", "http": "0", api: str(port)}
        done = subprocess.run(
            [sys.executable, "-m", "pdserve", "serve", "--colocated", "--model", str(llama),
             "--dtype", "float32", "--num-kv-blocks", "16",
             "--grpc-port", ports["grpc"], "--http-port", ports["http"]],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    _refused(done, "gRPC" if api == "grpc" else "HTTP", port)


# Held as a gRPC server holds it (a plain holder takes the same path, tested on the router).
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_worker_port_in_use_is_one_clear_error(llama: Path, role: str) -> None:
    with _held_port("reuseport") as port:
        done = subprocess.run(
            [sys.executable, "-m", f"{role}_service", "--port", str(port), "--model", str(llama),
             "--dtype", "float32", "--num-kv-blocks", "16", "--metrics-port", "-1",
             *(["--kv-transport", "tcp"] if role == "decode" else [])],
            capture_output=True, text=True, timeout=240, cwd=REPO,
        )  # fmt: skip
    _refused(done, "gRPC", port)
