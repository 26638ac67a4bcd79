"""Start ``pdserve serve --colocated`` as a real process on loopback and talk to it."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
# As `pdserve serve --worker-start-timeout-s`: a loaded 2-core machine took 89 s.
STARTUP_TIMEOUT_S = 300.0


_spawned: list[subprocess.Popen[str]] = []


@atexit.register
def _kill_leftovers() -> None:
    """A test killed by its timeout may skip its cleanup: no server outlives the run (nor do
    its workers: each server leads its own process group)."""
    for proc in _spawned:
        if proc.poll() is None:
            _kill_group(proc)


@dataclass
class Server:
    process: subprocess.Popen[str]
    grpc_address: str
    http_url: str
    model: str
    lines: list[str]
    colocated: bool = True
    # httpx options for the harness's own calls (TLS: {"verify": ssl context}).
    httpx_options: dict[str, Any] = field(default_factory=dict)

    @property
    def num_pools(self) -> int:
        """KV pools behind the router: 1 colocated; decode + prefill when disaggregated."""
        return 1 if self.colocated else 2

    def health(self) -> dict[str, Any]:
        """/health's body, also when it says 503 (unavailable, draining)."""
        r = httpx.get(f"{self.http_url}/health", timeout=10, **self.httpx_options)
        if r.status_code != 503:
            r.raise_for_status()
        return dict(r.json())

    def wait_pool_free(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll /health until every KV block is free and nothing is in flight."""
        deadline = time.monotonic() + timeout_s
        while True:
            h = self.health()
            load = h["load"]
            if (
                load["num_free_blocks"] == load["num_blocks"]
                and load["num_running_requests"] == 0
                and load["num_waiting_requests"] == 0
                and h["num_inflight_requests"] == 0
            ):
                return h
            if time.monotonic() > deadline:
                raise AssertionError(f"pool not free after {timeout_s}s: {h}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(self.process)
        return self.process.returncode


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the server and every worker it started (its own process group): killing the
    router alone would leave its prefill and decode workers running, orphaned."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def start_server(
    model: Path,
    *extra: str,
    colocated: bool = True,
    httpx_options: dict[str, Any] | None = None,
    env_extra: dict[str, str] | None = None,
) -> Server:
    """Launch on free ports (the server prints them) and wait until /health says ok.
    ``colocated=False`` starts the disaggregated mode (router + prefill + decode processes).
    ``httpx_options``: how the harness calls /health (e.g. TLS verification); ``env_extra``:
    added to the server's environment."""
    cmd = [
        "serve", *(["--colocated"] if colocated else []),
        "--model", str(model), "--dtype", "float32", *extra,
    ]  # fmt: skip
    return launch(cmd, colocated, httpx_options, env_extra)


def start_router(
    model: Path, decode: Sequence[str], prefill: Sequence[str], *extra: str
) -> Server:
    """``pdserve router`` over running workers (their gRPC targets), on free ports."""
    cmd = ["router", "--model", str(model)]
    for target in decode:
        cmd += ["--decode", target]
    for target in prefill:
        cmd += ["--prefill", target]
    return launch([*cmd, *extra], colocated=False)


def launch(
    pdserve_args: Sequence[str],
    colocated: bool,
    httpx_options: dict[str, Any] | None = None,
    env_extra: dict[str, str] | None = None,
) -> Server:
    """Run ``python -m pdserve ARGS --grpc-port 0 --http-port 0 --served-model-name tiny``
    and wait until it serves and /health says ok."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    cmd = [
        sys.executable, "-m", "pdserve", pdserve_args[0],
        "--grpc-port", "0", "--http-port", "0", "--served-model-name", "tiny",
        *pdserve_args[1:],  # after the harness's: a test's own --served-model-name comes second
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # one group with its workers, for _kill_group
    )
    _spawned.append(proc)
    lines: list[str] = []
    found: dict[str, str] = {}
    ready = threading.Event()

    def pump() -> None:  # keeps reading so the server never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("pdserve: gRPC "):
                found["grpc"] = line.split()[-1]
            elif line.startswith("pdserve: HTTP "):
                found["http"] = line.split()[-1]
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(STARTUP_TIMEOUT_S) or "http" not in found:
        _kill_group(proc)
        raise RuntimeError("server did not start:\n" + "".join(lines))
    server = Server(
        proc, found["grpc"], found["http"], "tiny", lines, colocated, dict(httpx_options or {})
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if server.health()["status"] == "ok":
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            server.stop()
            raise RuntimeError("server never became healthy:\n" + "".join(lines))
        time.sleep(0.1)
