"""Workers' security flags: mutual TLS on their gRPC port and on the KV channel, and the
decode endpoints a prefill worker pushes KV to.

    --tls-cert-file/--tls-key-file   this worker's certificate (it serves with it and shows it
                                     to the decode workers it pushes KV to)
    --tls-ca-file                    the release's CA: only clients with a certificate it
                                     signed may call this worker; decode's KV listener must
                                     show one too
    --tls-server-name                the name peers' certificates carry (default: the host
                                     dialled)
    --kv-allowed-peers               prefill: the only KV endpoints a ticket may name
"""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass

from kv_transfer.peers import PeerPolicy
from kv_transfer.transport import Connector
from pdserve.tls import (
    CertificateWatch,
    ClientTls,
    ServerTls,
    client_ssl_context,
    server_ssl_context,
    worker_tls_pair,
)


def add_tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (mutual TLS between the release's processes)")
    g.add_argument("--tls-cert-file", default=None, help="this worker's certificate (PEM)")
    g.add_argument("--tls-key-file", default=None, help="its private key (PEM)")
    g.add_argument(
        "--tls-ca-file",
        default=None,
        help="the release's CA (PEM): callers and KV peers need a certificate it signed",
    )
    g.add_argument(
        "--tls-server-name",
        default=None,
        help="the name in peers' certificates (default: the host dialled)",
    )


def add_kv_peer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kv-allowed-peers",
        action="append",
        default=None,
        help="the only decode KV endpoints a ticket may name: tcp://host:port, host:port, "
        "host or CIDR (repeat or comma-separate; default: any)",
    )
    p.add_argument(
        "--kv-peers-from-registry",
        action="store_true",
        help="with --redis-url: tickets may name only registered decode workers' KV endpoints "
        "(and --kv-allowed-peers); off by default while UCX endpoints are not matched reliably",
    )


@dataclass(frozen=True)
class WorkerSecurity:
    server: ServerTls | None  # the gRPC port (and decode's KV listener)
    client: ClientTls | None  # what this worker dials (prefill -> decode KV)
    peers: PeerPolicy | None  # prefill only

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> WorkerSecurity:
        """Raises ``ValueError`` naming the flag at fault."""
        server, client = worker_tls_pair(
            a.tls_cert_file, a.tls_key_file, a.tls_ca_file, a.tls_server_name
        )
        entries = getattr(a, "kv_allowed_peers", None)
        return cls(server, client, PeerPolicy.parse(entries) if entries else None)

    def kv_transport(self, requested: str) -> str:
        """The KV transport to use: with TLS, TCP (the one that carries certificates)."""
        if self.server is None:
            return requested
        if requested not in ("auto", "tcp"):
            raise ValueError(
                f"--kv-transport {requested} cannot authenticate its peers: with --tls-* "
                "options the KV channel runs over TCP with mutual TLS (--kv-transport tcp)"
            )
        return "tcp"

    def kv_server_context(self, watch: CertificateWatch) -> ssl.SSLContext | None:
        if self.server is None:
            return None
        return watch.add(server_ssl_context(self.server), self.server)

    def kv_connectors(self, watch: CertificateWatch) -> list[Connector] | None:
        """The sender's connectors: with TLS only mutual-TLS TCP (no plain scheme is left to
        reach a stranger with); None = every available transport."""
        if self.client is None:
            return None
        from kv_transfer.tcp import TcpConnector

        ctx = watch.add(client_ssl_context(self.client), self.client)
        return [TcpConnector(ctx, self.client.server_name)]


NO_SECURITY = WorkerSecurity(None, None, None)
