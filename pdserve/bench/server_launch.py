"""Start the server a config names (``[server] command``), wait until it answers, stop it after."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def is_ready(url: str) -> bool:
    """True when the target answers: ``GET {url}/models`` for OpenAI, a ready channel for gRPC."""
    if url.startswith("grpc://"):
        import grpc

        channel = grpc.insecure_channel(url.removeprefix("grpc://"))
        try:
            grpc.channel_ready_future(channel).result(timeout=1.0)
            return True
        except grpc.FutureTimeoutError:
            return False
        finally:
            channel.close()
    try:
        r = httpx.get(f"{url.rstrip('/')}/models", timeout=2.0, trust_env=False)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def launched_server(
    command: str | None, url: str, timeout_s: float, log_path: Path | None = None
) -> Iterator[None]:
    """Run ``command`` (if any) in its own process group until the block exits; its output
    goes to ``log_path`` (else is dropped). RuntimeError if it exits or is not ready in time."""
    if not command:
        yield
        return
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        shlex.split(command), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not is_ready(url):
            if proc.poll() is not None:
                raise RuntimeError(f"server command exited with {proc.returncode}: {command}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready at {url} after {timeout_s:g}s: {command}")
            time.sleep(0.5)
        yield
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the whole group: servers may have workers
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if log is not subprocess.DEVNULL:
            log.close()  # type: ignore[union-attr]
