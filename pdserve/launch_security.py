"""What ``pdserve serve`` (disaggregated) passes to its workers for security.

With ``--worker-tls-ca-file/--worker-tls-cert-file/--worker-tls-key-file`` the router dials
both workers over mutual TLS and each worker gets the same files as its ``--tls-*``: it
serves with that certificate, accepts only callers whose certificate the CA signed, and the
KV channel runs over mutual-TLS TCP. When the KV transport is TCP, decode's KV port is chosen
here and the prefill worker is told it is the only endpoint a ticket may name
(``--kv-allowed-peers``). Without those flags everything stays on loopback as before.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from kv_transfer.factory import resolve_transport
from pdserve.tls import ClientTls
from router.security import RouterSecurity


@dataclass(frozen=True)
class WorkerLaunchSecurity:
    router_tls: ClientTls | None  # how the router (and the health wait) dial the workers
    transport: str  # the KV transport the decode worker gets
    tls_argv: tuple[str, ...]  # every worker's --tls-* flags
    kv_endpoints: tuple[str, ...]  # each decode worker's KV endpoint, fixed in advance (TCP)
    kv_host: str

    @classmethod
    def from_args(
        cls,
        a: argparse.Namespace,
        transport: str,
        free_port: Callable[[int], int],
        num_decode: int = 1,
    ) -> WorkerLaunchSecurity:
        """Checks every router security flag now (before any worker starts)."""
        tls = RouterSecurity.from_args(a).worker_tls
        argv: tuple[str, ...] = ()
        if tls is not None:
            if transport not in ("auto", "tcp"):
                raise ValueError(
                    f"--kv-transport {transport} cannot authenticate its peers: with "
                    "--worker-tls-* options the KV channel runs over TCP with mutual TLS"
                )
            transport = "tcp"
            assert tls.cert_file is not None and tls.key_file is not None
            argv = ("--tls-cert-file", tls.cert_file, "--tls-key-file", tls.key_file)
            argv += ("--tls-ca-file", tls.ca_file)
            if tls.server_name:
                argv += ("--tls-server-name", tls.server_name)
        endpoints: tuple[str, ...] = ()
        if resolve_transport(transport) == "tcp":
            host = a.worker_host
            for _ in range(num_decode):
                port = free_port(0)
                endpoints += (f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}",)
        return cls(tls, transport, argv, endpoints, a.worker_host)

    def decode_argv(self, index: int = 0) -> list[str]:
        """The ``index``-th decode worker's flags."""
        argv = list(self.tls_argv)
        if self.kv_endpoints:
            port = self.kv_endpoints[index].rpartition(":")[2]
            argv += ["--kv-host", self.kv_host, "--kv-port", port]
        return argv

    def prefill_argv(self) -> list[str]:
        argv = list(self.tls_argv)
        if self.kv_endpoints:
            argv += ["--kv-allowed-peers", ",".join(self.kv_endpoints)]
        return argv
