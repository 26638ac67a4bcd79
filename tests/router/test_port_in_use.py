"""A router port that another process holds stops ``pdserve serve`` with one line naming the
port, exit 1, no traceback (gRPC's bind failure used to escape as a RuntimeError)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("api", ["grpc", "http"])
def test_a_port_in_use_is_one_clear_error(llama: Path, api: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        ports = {"grpc": "0", "http": "0", api: str(port)}
        done = subprocess.run(
            [sys.executable, "-m", "pdserve", "serve", "--colocated", "--model", str(llama),
             "--dtype", "float32", "--num-kv-blocks", "16",
             "--grpc-port", ports["grpc"], "--http-port", ports["http"]],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    name = "gRPC" if api == "grpc" else "HTTP"
    assert f"error: cannot listen for {name} on 127.0.0.1:{port}: " in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
