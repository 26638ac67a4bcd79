"""TLS and mutual TLS for every pdserve listener and connection, from PEM files.

    ServerTls(cert, key, client_ca)   a listener: its certificate; with ``client_ca`` every
                                      client must present a certificate signed by that CA
    ClientTls(ca, cert, key, name)    a connection: trust ``ca`` for the server's certificate,
                                      present ``cert`` (mTLS), expect ``name`` in the server's
                                      certificate (default: the host dialled)

The same objects make gRPC credentials (``grpc_server_credentials``, ``open_channel``) and
``ssl.SSLContext``s (uvicorn, the KV TCP transport). Certificates are reloaded when their
files change (Kubernetes swaps a mounted Secret's files in place): gRPC listeners through
grpc's dynamic credentials, checked at each new handshake; SSLContexts through
``CertificateWatch``, which the servers poll. Connections already open keep their session.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

logger = logging.getLogger(__name__)

RELOAD_CHECK_S = 1.0  # at most one stat() of the files per second


@dataclass(frozen=True)
class ServerTls:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None  # set: mutual TLS, clients need a cert signed by it

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.client_ca_file) if f)


@dataclass(frozen=True)
class ClientTls:
    ca_file: str
    cert_file: str | None = None  # set (with key_file): present it, for servers that ask
    key_file: str | None = None
    server_name: str | None = None  # the name the server's certificate must carry

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.ca_file, self.cert_file, self.key_file) if f)


def read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror}") from None
    if b"-----BEGIN" not in data:
        raise ValueError(f"{what}: {path} is not a PEM file")
    return data


def server_tls(
    cert_file: str | None, key_file: str | None, client_ca_file: str | None, flag: str
) -> ServerTls | None:
    """Checked flags -> ``ServerTls`` (None when no certificate is given). ``flag`` is the
    flags' prefix for messages, e.g. ``--tls``."""
    if not cert_file and not key_file:
        if client_ca_file:
            raise ValueError(f"{flag}-client-ca-file needs {flag}-cert-file and {flag}-key-file")
        return None
    if not cert_file or not key_file:
        raise ValueError(f"{flag}-cert-file and {flag}-key-file go together")
    tls = ServerTls(cert_file, key_file, client_ca_file or None)
    _check_files(tls.files, flag)
    server_ssl_context(tls)  # a bad key or a key of another certificate fails here, at start
    return tls


def client_tls(
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    server_name: str | None,
    flag: str,
) -> ClientTls | None:
    if not ca_file:
        if cert_file or key_file or server_name:
            raise ValueError(f"{flag}-ca-file is needed with the other {flag}-* options")
        return None
    if bool(cert_file) != bool(key_file):
        raise ValueError(f"{flag}-cert-file and {flag}-key-file go together")
    tls = ClientTls(ca_file, cert_file or None, key_file or None, server_name or None)
    _check_files(tls.files, flag)
    client_ssl_context(tls)
    return tls


def _check_files(paths: Sequence[str], flag: str) -> None:
    for path in paths:
        read_pem(path, flag)


# ---------------------------------------------------------------------------- ssl contexts
def server_ssl_context(tls: ServerTls) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=tls.client_ca_file)
    return ctx


def client_ssl_context(tls: ClientTls) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=tls.ca_file)
    if tls.cert_file and tls.key_file:
        _load_chain(ctx, tls.cert_file, tls.key_file)
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as e:
        raise ValueError(
            f"certificate {cert_file} and key {key_file} do not load together: {e.reason}"
        ) from None


class CertificateWatch:
    """Reloads SSLContexts' certificate chains when the files change; ``check()`` is cheap
    (one stat per file, at most every ``RELOAD_CHECK_S``). New handshakes use the new chain.
    A CA file that changes adds its certificates (OpenSSL cannot drop trusted ones)."""

    def __init__(self) -> None:
        self._entries: list[tuple[ssl.SSLContext, ServerTls | ClientTls, tuple[object, ...]]] = []
        self._next = 0.0
        self._lock = threading.Lock()

    def add(self, ctx: ssl.SSLContext, tls: ServerTls | ClientTls) -> ssl.SSLContext:
        self._entries.append((ctx, tls, file_signature(tls.files)))
        return ctx

    def check(self) -> int:
        """Reload what changed; returns how many contexts were reloaded."""
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                return 0
            self._next = now + RELOAD_CHECK_S
            reloaded = 0
            for k, (ctx, tls, seen) in enumerate(self._entries):
                sig = file_signature(tls.files)
                if sig == seen:
                    continue
                try:
                    _reload(ctx, tls)
                except (OSError, ValueError, ssl.SSLError) as e:
                    logger.warning("TLS files changed but do not load (keeping the old): %s", e)
                    continue
                self._entries[k] = (ctx, tls, sig)
                logger.info("TLS certificate reloaded from %s", ", ".join(tls.files))
                reloaded += 1
            return reloaded

    async def run(self, interval_s: float = RELOAD_CHECK_S) -> None:
        """Check every ``interval_s`` until cancelled (a worker's background task)."""
        while True:
            await asyncio.sleep(interval_s)
            self.check()


def _reload(ctx: ssl.SSLContext, tls: ServerTls | ClientTls) -> None:
    ca = tls.client_ca_file if isinstance(tls, ServerTls) else tls.ca_file
    if tls.cert_file and tls.key_file:
        _load_chain(ctx, tls.cert_file, tls.key_file)
    if ca:
        ctx.load_verify_locations(cafile=ca)


def file_signature(paths: Sequence[str]) -> tuple[object, ...]:
    """What changes when a file is replaced or rewritten (None for a missing file)."""
    out: list[object] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


# ---------------------------------------------------------------------------- gRPC
def grpc_server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Server credentials that pick up changed files at the next handshake."""
    fetch = _GrpcCertificates(tls)
    return grpc.dynamic_ssl_server_credentials(
        fetch.current(),
        fetch,
        require_client_authentication=tls.client_ca_file is not None,
    )


class _GrpcCertificates:
    def __init__(self, tls: ServerTls) -> None:
        self._tls = tls
        self._seen = file_signature(tls.files)
        self._next = 0.0
        self._lock = threading.Lock()

    def current(self) -> object:
        t = self._tls
        root = read_pem(t.client_ca_file, "client CA") if t.client_ca_file else None
        pairs = [(read_pem(t.key_file, "key"), read_pem(t.cert_file, "certificate"))]
        return grpc.ssl_server_certificate_configuration(pairs, root_certificates=root)

    def __call__(self) -> object | None:
        """grpc's fetcher (called on its threads before a handshake): a new configuration, or
        None to keep the current one."""
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                return None
            self._next = now + RELOAD_CHECK_S
            sig = file_signature(self._tls.files)
            if sig == self._seen:
                return None
            try:
                config = self.current()
                server_ssl_context(self._tls)  # the new pair must belong together
            except (ValueError, ssl.SSLError) as e:
                logger.warning("TLS files changed but do not load (keeping the old): %s", e)
                return None
            self._seen = sig
            logger.info("gRPC TLS certificate reloaded from %s", ", ".join(self._tls.files))
            return config


def grpc_channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    key = read_pem(tls.key_file, "key") if tls.key_file else None
    cert = read_pem(tls.cert_file, "certificate") if tls.cert_file else None
    return grpc.ssl_channel_credentials(read_pem(tls.ca_file, "CA"), key, cert)


# A worker that restarts, or is still loading its model, must be dialled again within seconds,
# not after gRPC's default reconnect back-off (up to 120 s): a router would keep a ready
# worker out of routing for minutes.
RECONNECT_OPTIONS: list[tuple[str, str | int]] = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

# Messages between pdserve's own processes, both ways. A worker takes what its router let in
# (prompt ids of up to max_model_len, a JSON schema as large as the router's body limit) and a
# router reads a worker's whole KV snapshot (16 bytes a cached block). grpc's 4 MiB default
# refused both, for a long-context model or a large pool, and the router took the worker's
# RESOURCE_EXHAUSTED for a full pool (429 to a request no retry could pass). The bound only
# keeps a stray peer from making a process buffer gigabytes.
INTERNAL_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MESSAGE_OPTIONS: list[tuple[str, str | int]] = [
    ("grpc.max_receive_message_length", INTERNAL_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", INTERNAL_MAX_MESSAGE_BYTES),
]


def channel_options(tls: ClientTls | None) -> list[tuple[str, str | int]]:
    """Options of a channel to another pdserve process."""
    options = [*RECONNECT_OPTIONS, *MESSAGE_OPTIONS]
    if tls is None or not tls.server_name:
        return options
    return [*options, ("grpc.ssl_target_name_override", tls.server_name)]


def open_channel(target: str, tls: ClientTls | None) -> grpc.aio.Channel:
    """An asyncio channel to ``target``: plain without ``tls``, else verified (m)TLS. The
    credentials are read now: a channel opened after a rotation uses the new files."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=channel_options(None))
    return grpc.aio.secure_channel(
        target, grpc_channel_credentials(tls), options=channel_options(tls)
    )


def open_sync_channel(target: str, tls: ClientTls | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target, options=channel_options(None))
    return grpc.secure_channel(target, grpc_channel_credentials(tls), options=channel_options(tls))


# Every pdserve gRPC server takes its port alone. grpc sets SO_REUSEPORT by default, so a
# second server on a port already served (another `pdserve serve` left on the default
# --grpc-port, a worker on a taken --port) bound it without a word and the kernel split the
# connections between the two: clients reached either model, at random.
EXCLUSIVE_PORT: tuple[str, int] = ("grpc.so_reuseport", 0)


def add_port(server: grpc.aio.Server, address: str, tls: ServerTls | None) -> int:
    """Bind ``address`` plain or with TLS; returns the port. Raises OSError naming the address
    when it cannot bind (grpcio raises a RuntimeError that names no cause; older ones
    returned 0)."""
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, grpc_server_credentials(tls))
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(
            f"cannot listen for gRPC on {address}: the port is in use, or the address is not "
            "one of this machine's"
        )
    return port


def worker_tls_pair(
    cert_file: str | None,
    key_file: str | None,
    ca_file: str | None,
    server_name: str | None,
    flag: str = "--tls",
) -> tuple[ServerTls | None, ClientTls | None]:
    """A worker's flags -> (how it listens, how it dials its peers). Between services TLS is
    always mutual: a certificate without a CA is refused."""
    if (cert_file or key_file) and not ca_file:
        raise ValueError(
            f"{flag}-ca-file is required with {flag}-cert-file: workers accept only clients "
            "whose certificate that CA signed (mutual TLS)"
        )
    server = server_tls(cert_file, key_file, ca_file, flag)
    client = client_tls(ca_file, cert_file, key_file, server_name, flag)
    if client is not None and server is None:
        raise ValueError(f"{flag}-cert-file and {flag}-key-file are needed with {flag}-ca-file")
    return server, client
