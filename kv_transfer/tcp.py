"""TCP transport: always available. Plain asyncio sockets, no streams.

Bytes go ``sock_sendall(memoryview of the source pool)`` -> ``sock_recv_into(memoryview of the
destination pool)``: no intermediate buffer, no StreamReader (measured 5x slower here). One
connection per (sender, receiver) pair carries every request's frames; a frame is written
whole under a lock, so concurrent requests interleave frame by frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
from collections.abc import Sequence
from typing import Any

import numpy as np

from kv_transfer.errors import (
    IncompatiblePeerError,
    PeerLostError,
    PeerNotTrustedError,
    TransferTimeoutError,
)
from kv_transfer.receiver import PushPlan, ReceiverBase
from kv_transfer.tcp_stream import ByteStream, accepted_stream, connected_stream
from kv_transfer.wire import HEADER_PREFIX, MAX_HEADER_BYTES, encode_frame
from protos.pdserve.v1 import kv_transfer_pb2 as pb

_DRAIN_CHUNK = 1 << 20
_SOCKET_BUFFER = 4 << 20
TLS_HANDSHAKE_TIMEOUT_S = 10.0

_log = logging.getLogger(__name__)


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)


async def _recv_exactly(stream: ByteStream, view: Any) -> None:
    view = memoryview(view).cast("B")
    got = 0
    while got < len(view):
        n = await stream.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


async def _read_frame(stream: ByteStream) -> pb.KVFrame:
    prefix = bytearray(HEADER_PREFIX.size)
    await _recv_exactly(stream, prefix)
    (size,) = HEADER_PREFIX.unpack(prefix)
    if size > MAX_HEADER_BYTES:
        raise ConnectionError(f"frame header of {size} bytes exceeds {MAX_HEADER_BYTES}")
    header = bytearray(size)
    await _recv_exactly(stream, header)
    frame = pb.KVFrame()
    frame.ParseFromString(bytes(header))
    return frame


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``"tcp://host:port"`` -> ``(host, port)``."""
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"not a tcp endpoint: {endpoint!r}")
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    return host.strip("[]"), int(port)


class TcpReceiver(ReceiverBase):
    """Decode side over TCP; listens on ``host:port`` (port 0: any free port). With
    ``ssl_context`` (a server context requiring client certificates) every connection is
    mutual TLS: a sender without a certificate the context trusts is cut at the handshake."""

    scheme = "tcp"

    def __init__(
        self,
        *args: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._connections: dict[int, ByteStream] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._peer_ids = itertools.count(1)

    async def _start_transport(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, self._port))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        host, port = listener.getsockname()[:2]
        self._endpoint = (
            f"tcp://[{host}]:{port}" if family == socket.AF_INET6 else f"tcp://{host}:{port}"
        )
        self._accept_task = asyncio.create_task(self._accept())

    async def _close_transport(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            await asyncio.gather(self._accept_task, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        for stream in self._connections.values():
            stream.shutdown()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _cut_peer(self, peer: object) -> None:
        stream = self._connections.get(peer) if isinstance(peer, int) else None
        if stream is not None:
            stream.shutdown()  # the pending recv returns 0: write fails

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            sock, address = await loop.sock_accept(self._listener)
            _tune(sock)
            peer = next(self._peer_ids)
            task = asyncio.create_task(self._serve(sock, peer, address))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, sock: socket.socket, peer: int, address: Any) -> None:
        stream: ByteStream | None = None
        try:
            try:
                stream = await accepted_stream(sock, self._ssl, TLS_HANDSHAKE_TIMEOUT_S)
            except (OSError, TimeoutError) as e:
                _log.warning("KV connection from %s refused: TLS handshake: %s", address, e)
                self.metrics.record_failure("tls_handshake")
                return
            self._connections[peer] = stream
            first = await _read_frame(stream)
            if first.WhichOneof("body") != "hello":
                return
            reply = self.core.hello(first.hello)
            await stream.sendall(encode_frame(pb.KVFrame(seq=first.seq, hello_reply=reply)))
            if reply.status != pb.KV_STATUS_OK:
                return
            while True:
                frame = await _read_frame(stream)
                answer = await self._handle(stream, frame, peer)
                await stream.sendall(encode_frame(pb.KVFrame(seq=frame.seq, ack=answer)))
        except (ConnectionError, OSError):
            pass
        finally:
            self._connections.pop(peer, None)
            self.core.table.peer_lost(peer)
            if stream is not None:
                stream.close()  # closes the socket
            else:
                sock.close()

    async def _handle(self, stream: ByteStream, frame: pb.KVFrame, peer: int) -> pb.KVAck:
        kind = frame.WhichOneof("body")
        if kind == "push":
            plan = self.core.begin_push(frame.push, peer)
            if not isinstance(plan, PushPlan):
                await self._drain(stream, frame.push.payload_bytes)
                return plan
            ok = False
            try:
                for span in plan.spans:
                    await _recv_exactly(stream, span)
                ok = True
            finally:
                answer = self.core.end_push(plan, ok)
            return answer
        if kind == "renew":
            return self.core.renew(frame.renew, peer)
        if kind == "abort":
            return self.core.abort(frame.abort)
        raise ConnectionError(f"unexpected {kind} frame")

    @staticmethod
    async def _drain(stream: ByteStream, num_bytes: int) -> None:
        scratch = memoryview(bytearray(min(num_bytes, _DRAIN_CHUNK)))
        while num_bytes:
            n = min(num_bytes, len(scratch))
            await _recv_exactly(stream, scratch[:n])
            num_bytes -= n


class TcpChannel:
    """A sender's connection to one TCP receiver."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._loop = asyncio.get_running_loop()
        self._write_lock = asyncio.Lock()
        self._seq = itertools.count(1)
        self._replies: dict[int, asyncio.Future[pb.KVFrame]] = {}
        self._error: Exception | None = None
        self._reader: asyncio.Task[None] | None = None
        self._exchanges: set[asyncio.Future[pb.KVFrame]] = set()

    @property
    def is_closed(self) -> bool:
        return self._error is not None

    async def handshake(self, hello: pb.KVHello, timeout: float) -> None:
        seq = next(self._seq)
        await asyncio.wait_for(
            self._stream.sendall(encode_frame(pb.KVFrame(seq=seq, hello=hello))), timeout
        )
        reply = await asyncio.wait_for(_read_frame(self._stream), timeout)
        if reply.WhichOneof("body") != "hello_reply":
            raise PeerLostError(f"expected a hello reply, got {reply.WhichOneof('body')}")
        if reply.hello_reply.status != pb.KV_STATUS_OK:
            raise IncompatiblePeerError(reply.hello_reply.error)
        self._reader = asyncio.create_task(self._read_replies())

    async def call(
        self, frame: pb.KVFrame, payload: Sequence[np.ndarray], timeout: float
    ) -> pb.KVFrame:
        if self._error is not None:
            raise PeerLostError(str(self._error))
        # The exchange runs on its own: a caller cancelled mid-frame must not cut the frame
        # (that would desynchronize the connection every other transfer shares). It ends by
        # itself: with the reply (then dropped), or at its deadline.
        exchange = asyncio.ensure_future(self._exchange(frame, payload, timeout))
        self._exchanges.add(exchange)
        exchange.add_done_callback(self._exchange_done)
        return await asyncio.shield(exchange)

    def _exchange_done(self, exchange: asyncio.Future[pb.KVFrame]) -> None:
        self._exchanges.discard(exchange)
        if not exchange.cancelled():
            exchange.exception()  # retrieved here when its caller is gone

    async def _exchange(
        self, frame: pb.KVFrame, payload: Sequence[np.ndarray], timeout: float
    ) -> pb.KVFrame:
        seq = next(self._seq)
        frame.seq = seq
        reply: asyncio.Future[pb.KVFrame] = self._loop.create_future()
        self._replies[seq] = reply
        deadline = self._loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                async with self._write_lock:
                    await self._write(frame, payload)
                return await reply
        except TimeoutError as e:
            raise TransferTimeoutError(f"no reply within {timeout:.1f}s") from e
        finally:
            self._replies.pop(seq, None)

    async def _write(self, frame: pb.KVFrame, payload: Sequence[np.ndarray]) -> None:
        # A frame cut in half (error, timeout, cancellation) desynchronizes the stream: the
        # connection is then finished, and every call waiting on it fails with PeerLostError.
        try:
            await self._stream.sendall(encode_frame(frame))
            for span in payload:
                await self._stream.sendall(span.data.cast("B"))
        except OSError as e:
            self._fail(e)
            raise PeerLostError(f"send failed: {e}") from e
        except BaseException:
            self._fail(PeerLostError("send interrupted"))
            raise

    async def _read_replies(self) -> None:
        try:
            while True:
                frame = await _read_frame(self._stream)
                future = self._replies.get(frame.seq)
                if future is not None and not future.done():
                    future.set_result(frame)
        except (ConnectionError, OSError) as e:
            self._fail(e)
        except asyncio.CancelledError:
            self._fail(PeerLostError("channel closed"))

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        for future in self._replies.values():
            if not future.done():
                future.set_exception(PeerLostError(f"connection lost: {error}"))
        self._stream.shutdown()

    async def close(self) -> None:
        self._fail(PeerLostError("channel closed"))
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        # Failed above: each exchange ends at once (its reply fails, its write errors).
        await asyncio.gather(*self._exchanges, return_exceptions=True)
        self._stream.close()


class TcpConnector:
    """Opens TCP channels; with ``ssl_context`` (a client context holding this worker's
    certificate) over mutual TLS, checking that the receiver's certificate chains to the
    context's CA and names ``server_name`` (default: the host of the endpoint)."""

    scheme = "tcp"

    def __init__(
        self, ssl_context: ssl.SSLContext | None = None, server_name: str | None = None
    ) -> None:
        self._ssl = ssl_context
        self._server_name = server_name

    async def connect(self, endpoint: str, hello: pb.KVHello, timeout: float) -> TcpChannel:
        host, port = parse_endpoint(endpoint)
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        _tune(sock)
        stream: ByteStream | None = None
        try:
            await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
            try:
                stream = await connected_stream(sock, self._ssl, self._server_name or host, timeout)
            except ssl.SSLError as e:
                raise PeerNotTrustedError(f"TLS handshake with {endpoint} failed: {e}") from e
            channel = TcpChannel(stream)
            await channel.handshake(hello, timeout)
        except BaseException:
            if stream is not None:
                stream.close()  # closes the socket
            else:
                sock.close()
            raise
        return channel
