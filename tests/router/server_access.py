"""What a test client carries to be let into a server: the API key, the CA it trusts, the
certificate it presents, turned into what httpx, grpc and grpcurl take."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class Access:
    """What a client needs to be let in: the API key it sends (``Authorization: Bearer``), the
    CA it trusts for the server's certificate (None: plain HTTP and gRPC) and the certificate
    it presents (for a server that asks for one). All None: a plain server without keys."""

    api_key: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context that verifies the server (and presents the client certificate)."""
        if self.ca_file is None:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def grpc_credentials(self, with_key: bool = True) -> grpc.ChannelCredentials | None:
        """TLS channel credentials, the key composed in as per-call ``authorization``
        metadata (``with_key=False``: without it). None: a plaintext channel."""
        if self.ca_file is None:
            if self.api_key:  # grpc sends call credentials only over TLS
                raise ValueError("a gRPC API key needs TLS (Access.ca_file)")
            return None
        creds = grpc.ssl_channel_credentials(
            _read(self.ca_file), _read(self.key_file), _read(self.cert_file)
        )
        if with_key and self.api_key:
            token = grpc.access_token_call_credentials(self.api_key)
            creds = grpc.composite_channel_credentials(creds, token)
        return creds

    def grpcurl_args(self) -> list[str]:
        """grpcurl's flags for this access: ``-plaintext``, or the CA, certificate and key."""
        if self.ca_file is None:
            return ["-plaintext"]
        args = ["-cacert", self.ca_file]
        if self.cert_file and self.key_file:
            args += ["-cert", self.cert_file, "-key", self.key_file]
        if self.api_key:
            args += ["-H", f"authorization: Bearer {self.api_key}"]
        return args


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None
