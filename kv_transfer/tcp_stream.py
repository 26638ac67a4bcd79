"""The byte stream under the TCP transport: a plain socket, or the same socket inside TLS.

Plain streams use the event loop's socket calls straight into the pool's memory (no buffer
between socket and pool). TLS streams (mutual TLS between the release's workers: decode's
listener requires a client certificate signed by the release's CA, prefill verifies decode's)
go through asyncio's SSL transport: each received chunk is decrypted into a buffer and copied
into the pool, the price of encryption.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any, Protocol

_TLS_READ_LIMIT = 4 << 20  # bytes asyncio buffers before it pauses reading


class ByteStream(Protocol):
    async def recv_into(self, view: memoryview) -> int:
        """Read at most ``len(view)`` bytes into ``view``; 0 means the peer closed."""

    async def sendall(self, data: Any) -> None: ...

    def shutdown(self) -> None:
        """Stop both directions now: a pending ``recv_into`` returns 0 or fails."""

    def close(self) -> None: ...


class SocketStream:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()

    async def recv_into(self, view: memoryview) -> int:
        return await self._loop.sock_recv_into(self._sock, view)

    async def sendall(self, data: Any) -> None:
        await self._loop.sock_sendall(self._sock, data)

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()


class TlsStream:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        transport: asyncio.Transport,
        protocol: asyncio.StreamReaderProtocol,
    ) -> None:
        self._reader = reader
        self._transport = transport
        self._writer = asyncio.StreamWriter(transport, protocol, reader, asyncio.get_running_loop())

    async def recv_into(self, view: memoryview) -> int:
        data = await self._reader.read(len(view))
        view[: len(data)] = data
        return len(data)

    async def sendall(self, data: Any) -> None:
        if self._transport.is_closing():
            raise ConnectionError("TLS connection closed")
        self._writer.write(data)
        await self._writer.drain()

    def shutdown(self) -> None:
        self._transport.abort()

    def close(self) -> None:
        self._transport.abort()

    def peer_certificate(self) -> dict[str, Any] | None:
        return self._transport.get_extra_info("peercert")  # type: ignore[no-any-return]


async def _wrap(
    sock: socket.socket,
    ctx: ssl.SSLContext,
    timeout: float,
    server_hostname: str | None,
) -> TlsStream:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_TLS_READ_LIMIT)
    protocol = asyncio.StreamReaderProtocol(reader)
    if server_hostname is None:  # the accepting side
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol, sock, ssl=ctx, ssl_handshake_timeout=timeout
        )
    else:
        transport, _ = await loop.create_connection(
            lambda: protocol,
            sock=sock,
            ssl=ctx,
            server_hostname=server_hostname,
            ssl_handshake_timeout=timeout,
        )
    return TlsStream(reader, transport, protocol)  # type: ignore[arg-type]


async def accepted_stream(
    sock: socket.socket, ctx: ssl.SSLContext | None, timeout: float
) -> ByteStream:
    """The stream of an accepted connection; with ``ctx``, after the TLS handshake (raises
    ``ssl.SSLError``, an ``OSError``, when the peer has no acceptable certificate)."""
    if ctx is None:
        return SocketStream(sock)
    return await _wrap(sock, ctx, timeout, None)


async def connected_stream(
    sock: socket.socket,
    ctx: ssl.SSLContext | None,
    server_name: str,
    timeout: float,
) -> ByteStream:
    """The stream of a connected socket; with ``ctx``, after verifying that the server's
    certificate chains to the CA and names ``server_name``."""
    if ctx is None:
        return SocketStream(sock)
    return await _wrap(sock, ctx, timeout, server_name)
