"""Start ``pdserve serve`` as a real process on loopback and talk to it with real clients.

``Server`` hands out every client a test needs (httpx, openai, gRPC sync and asyncio, grpcurl
flags, a raw socket), each carrying what the server asks for (``Access``: the API key, the CA
to trust, the client certificate), so one test runs unchanged against a plain server and one
with API keys and TLS on."""

from __future__ import annotations

import atexit
import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import httpx
import openai

from tests.router.server_access import Access

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
    # httpx options for every client the harness makes (TLS: {"verify": ssl context}).
    httpx_options: dict[str, Any] = field(default_factory=dict)
    access: Access = field(default_factory=Access)

    @property
    def num_pools(self) -> int:
        """KV pools behind the router: 1 colocated; decode + prefill when disaggregated."""
        return 1 if self.colocated else 2

    # ------------------------------------------------------------------- clients
    @functools.cached_property
    def _ssl_context(self) -> ssl.SSLContext | None:
        """One client context for every HTTPS client (None: plain HTTP)."""
        return self.access.ssl_context()

    def _httpx_kwargs(self, kw: dict[str, Any]) -> dict[str, Any]:
        ctx = self._ssl_context
        out: dict[str, Any] = {"base_url": self.http_url, "timeout": 60.0}
        if ctx is not None:
            out["verify"] = ctx
        out |= self.httpx_options
        out["headers"] = {**self.access.headers, **kw.pop("headers", {})}
        return out | kw

    def http(self, **kw: Any) -> httpx.Client:
        """An httpx client for the HTTP port: base URL, TLS verification, the key (default
        timeout 60 s; ``kw`` overrides, ``headers`` add to the key's)."""
        return httpx.Client(**self._httpx_kwargs(kw))

    def async_http(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(**self._httpx_kwargs(kw))

    def get(self, path: str, **kw: Any) -> httpx.Response:
        """One GET on a fresh connection (as ``httpx.get``); ``kw`` as ``httpx.Client.get``."""
        with self.http(timeout=kw.pop("timeout", 60.0)) as client:
            return client.get(path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        with self.http(timeout=kw.pop("timeout", 60.0)) as client:
            return client.post(path, **kw)

    def openai(self, timeout: float = 60.0) -> openai.OpenAI:
        """The official openai client, with this server's key and TLS; no retries."""
        ctx = self._ssl_context
        return openai.OpenAI(
            base_url=f"{self.http_url}/v1",
            api_key=self.access.api_key or "unused",
            max_retries=0,
            timeout=timeout,
            http_client=openai.DefaultHttpxClient(verify=ctx) if ctx is not None else None,
        )

    def grpc_channel(self) -> grpc.Channel:
        """A gRPC channel to the router: plaintext, or TLS with the key on every call."""
        creds = self.access.grpc_credentials()
        if creds is None:
            return grpc.insecure_channel(self.grpc_address)
        return grpc.secure_channel(self.grpc_address, creds)

    def grpc_aio_channel(self) -> grpc.aio.Channel:
        creds = self.access.grpc_credentials()
        if creds is None:
            return grpc.aio.insecure_channel(self.grpc_address)
        return grpc.aio.secure_channel(self.grpc_address, creds)

    def connect(self, timeout_s: float = 5.0) -> socket.socket:
        """A raw connection to the HTTP port (TLS-wrapped on HTTPS), for bytes no client sends."""
        url = urlsplit(self.http_url)
        assert url.hostname is not None and url.port is not None
        sock = socket.create_connection((url.hostname, url.port), timeout=timeout_s)
        ctx = self._ssl_context
        if ctx is None:
            return sock
        return ctx.wrap_socket(sock, server_hostname=url.hostname)

    def health(self) -> dict[str, Any]:
        """/health's body, also when it says 503 (unavailable, draining)."""
        r = self.get("/health", timeout=10)
        if r.status_code != 503:
            r.raise_for_status()
        return dict(r.json())

    def metric(self, name: str, **labels: str) -> float:
        """Sample ``name`` of /metrics, summed over its label sets that carry ``labels`` (0 when
        there is none)."""
        total = 0.0
        for line in self.get("/metrics", timeout=10).text.splitlines():
            series, _, value = line.rpartition(" ")
            metric, _, label_text = series.partition("{")
            if metric == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total

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
    access: Access | None = None,
) -> Server:
    """Launch on free ports (the server prints them) and wait until /health says ok.
    ``colocated=False`` starts the disaggregated mode (router + prefill + decode processes).
    ``httpx_options``: added to every httpx client the harness makes (e.g. TLS verification);
    ``env_extra``: added to the server's environment; ``access``: what the server's security
    flags ask of clients (its clients carry it)."""
    cmd = [
        "serve", *(["--colocated"] if colocated else []),
        "--model", str(model), "--dtype", "float32", *extra,
    ]  # fmt: skip
    return launch(cmd, colocated, httpx_options, env_extra, access)


def start_router(model: Path, decode: Sequence[str], prefill: Sequence[str], *extra: str) -> Server:
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
    access: Access | None = None,
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
        proc,
        found["grpc"],
        found["http"],
        "tiny",
        lines,
        colocated,
        dict(httpx_options or {}),
        access or Access(),
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
