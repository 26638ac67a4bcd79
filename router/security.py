"""The router's security settings and their run-time pieces.

    RouterSecurity.from_args(a)    --api-key*, --auth-exempt, --tls-*, --worker-tls-* flags
    RouterGuard(security, metrics) what serve_router plugs in: the HTTP middleware, the gRPC
                                   interceptor, uvicorn's TLS options, the reload loop

Public side: API keys (router.auth) on HTTP and gRPC, TLS (optionally mutual) on both ports.
Worker side: the router dials its workers over mutual TLS with ``--worker-tls-*``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
from dataclasses import dataclass, field
from typing import Any

import grpc

from pdserve.tls import (
    RELOAD_CHECK_S,
    CertificateWatch,
    ClientTls,
    ServerTls,
    client_tls,
    server_tls,
)
from router.auth import DEFAULT_EXEMPT, ENV_VAR, ApiKeys, Authenticator, ExemptPaths
from router.auth_grpc import ApiKeyInterceptor
from router.auth_http import ApiKeyMiddleware
from router.auth_metrics import AuthMetrics


def add_security_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security")
    g.add_argument(
        "--api-key",
        action="append",
        default=None,
        help=f"an accepted API key (repeatable; also the file below and ${ENV_VAR}, "
        "comma-separated); clients send 'Authorization: Bearer KEY'. Keys on the command "
        "line are visible to other local users: prefer the file or the variable",
    )
    g.add_argument(
        "--api-key-file",
        default=None,
        help="a file of accepted API keys, one per line (# comments); reloaded when it "
        "changes and on SIGHUP",
    )
    g.add_argument(
        "--auth-exempt",
        action="append",
        default=None,
        help="a path open without a key (repeatable; a trailing / makes it a prefix; "
        f"'' = none); default: {' '.join(DEFAULT_EXEMPT)}",
    )
    g.add_argument("--tls-cert-file", default=None, help="serve HTTPS and gRPC TLS with it")
    g.add_argument("--tls-key-file", default=None, help="the key of --tls-cert-file")
    g.add_argument(
        "--tls-client-ca-file",
        default=None,
        help="clients must present a certificate this CA signed (mutual TLS)",
    )
    g.add_argument(
        "--worker-tls-ca-file",
        default=None,
        help="dial the workers over mutual TLS: their certificates chain to this CA",
    )
    g.add_argument("--worker-tls-cert-file", default=None, help="the router's certificate")
    g.add_argument("--worker-tls-key-file", default=None, help="its key")
    g.add_argument(
        "--worker-tls-server-name",
        default=None,
        help="the name in the workers' certificates (default: the host dialled)",
    )


@dataclass(frozen=True)
class RouterSecurity:
    keys: ApiKeys | None = None
    exempt: ExemptPaths = field(default_factory=lambda: ExemptPaths.parse(DEFAULT_EXEMPT))
    tls: ServerTls | None = None
    worker_tls: ClientTls | None = None

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> RouterSecurity:
        """Raises ``ValueError`` naming the flag at fault."""
        keys = ApiKeys.load(a.api_key, a.api_key_file, os.environ.get(ENV_VAR))
        exempt = ExemptPaths.parse(DEFAULT_EXEMPT if a.auth_exempt is None else a.auth_exempt)
        tls = server_tls(a.tls_cert_file, a.tls_key_file, a.tls_client_ca_file, "--tls")
        worker = client_tls(
            a.worker_tls_ca_file,
            a.worker_tls_cert_file,
            a.worker_tls_key_file,
            a.worker_tls_server_name,
            "--worker-tls",
        )
        if worker is not None and worker.cert_file is None:
            raise ValueError(
                "--worker-tls-cert-file/--worker-tls-key-file are needed with "
                "--worker-tls-ca-file: workers accept only callers with a certificate"
            )
        return cls(keys, exempt, tls, worker)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"


class RouterGuard:
    """What ``serve_router`` plugs into its servers for one ``RouterSecurity``."""

    def __init__(self, security: RouterSecurity, registry: Any, role: str, model: str) -> None:
        self.security = security
        self.metrics = AuthMetrics(registry, role, model)
        keys = security.keys
        self._auth = Authenticator(keys, security.exempt) if keys is not None else None
        self._certificates = CertificateWatch()

    def wrap_http(self, app: Any) -> Any:
        return app if self._auth is None else ApiKeyMiddleware(app, self._auth, self.metrics)

    def grpc_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [] if self._auth is None else [ApiKeyInterceptor(self._auth, self.metrics)]

    def uvicorn_tls(self) -> dict[str, Any]:
        tls = self.security.tls
        if tls is None:
            return {}
        options: dict[str, Any] = {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
        if tls.client_ca_file:
            options |= {"ssl_ca_certs": tls.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options

    def watch_http_context(self, ctx: ssl.SSLContext | None) -> None:
        """Reload uvicorn's context (``config.ssl``, built at startup) when its files change."""
        if ctx is not None and self.security.tls is not None:
            self._certificates.add(ctx, self.security.tls)

    def reload_keys(self) -> None:
        """SIGHUP: read the key file again now."""
        keys = self.security.keys
        if keys is not None and keys.has_file:
            self.metrics.reloaded(keys.reload())

    async def run(self) -> None:
        """Poll the key file and the certificates until cancelled."""
        keys = self.security.keys
        while True:
            await asyncio.sleep(RELOAD_CHECK_S)
            if keys is not None:
                result = await asyncio.to_thread(keys.reload_if_changed)
                if result is not None:
                    self.metrics.reloaded(result)
            self._certificates.check()
