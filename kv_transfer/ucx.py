"""UCX transport over ucxx (the optional ``pdserve[ucx]`` extra), chosen by "auto" when present.

Why it is built this way (facts measured on a 2-core VM without GPU):

* Endpoints are created from **worker addresses** with ``endpoint_error_handling=False``: UCX
  then uses shared memory (sysv + cma) between processes on one host, ~3-7 GB/s. A listener
  with error handling picks only ``tcp/lo`` (~0.45 GB/s, slower than our TCP transport).
* ucxx is imported and initialised lazily, in the process that uses it, never before a fork.
  Its TCP listeners are kept on the configured host's interface (``UCX_NET_DEVICES``, unless
  set already): by default loopback, like every other pdserve listener. Its notifier thread
  must be stopped before the process can exit (``release``).
* Without error handling UCX does not report a dead peer. Every wait has a deadline instead;
  a timed-out or failed channel aborts its endpoint, which cancels the requests still posted on
  it, so no late byte is read from (or written into) a pool after the call gave up.

Messages use tags (64 bits)::

    control (to a receiver)      0x00000000_4B560001   header frames, received worker-wide
    acks    (to one sender)      sender_id << 32 | 0
    payload (to a receiver)      sender_id << 32 | n   n = 1, 2, ... (push.payload_tag + k)

``sender_id`` is random and odd, so its tags never equal the control tag. A header frame is
``u32 length + KVFrame`` in a buffer of at most ``MAX_CONTROL_BYTES``; each payload segment
(blocks contiguous in both pools) is one tagged message received straight into the pool.

A push is two exchanges: header -> ``KVAck{ready}`` (the receiver checked it and posted one
receive per segment) -> payload -> final ``KVAck``. Sending the payload only to posted receives
avoids UCX's unexpected-rendezvous path, which cost ~5 ms per message with thread progress on
a busy host, and a refused push never sends its payload at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from kv_transfer.errors import IncompatiblePeerError, PeerLostError, TransferTimeoutError
from kv_transfer.netif import interface_of
from kv_transfer.receiver import PushPlan, ReceiverBase
from kv_transfer.ucx_endpoint import create_endpoint
from kv_transfer.wire import HEADER_PREFIX
from protos.pdserve.v1 import kv_transfer_pb2 as pb

CONTROL_TAG = 0x4B56_0001
MAX_CONTROL_BYTES = 64 << 10
_TAG_MASK = (1 << 32) - 1
_ACK_TIMEOUT_S = 5.0
_log = logging.getLogger(__name__)
_started = False


def _ucxx(host: str) -> Any:
    """ucxx, initialised on first use with its network devices limited to ``host``'s."""
    global _started
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    if not _started:
        device = interface_of(host)
        if device is not None:
            os.environ.setdefault("UCX_NET_DEVICES", device)
    import ucxx

    ucxx.continuous_ucx_progress()
    _started = True
    return ucxx


async def release() -> None:
    """Stop this process's UCX notifier thread (a non-daemon thread: the process cannot exit
    while it runs). Call once, at exit, after every receiver and channel is closed; a no-op
    when UCX was never used here."""
    if _started:
        import ucxx

        await asyncio.to_thread(ucxx.stop_notifier_thread)


def _pack(frame: pb.KVFrame) -> np.ndarray:
    body = frame.SerializeToString()
    if HEADER_PREFIX.size + len(body) > MAX_CONTROL_BYTES:
        raise ValueError(f"control frame of {len(body)} bytes exceeds {MAX_CONTROL_BYTES}")
    return np.frombuffer(HEADER_PREFIX.pack(len(body)) + body, dtype=np.uint8)


def _unpack(buffer: np.ndarray) -> pb.KVFrame:
    (size,) = HEADER_PREFIX.unpack(buffer[: HEADER_PREFIX.size].tobytes())
    if HEADER_PREFIX.size + size > len(buffer):
        raise ValueError("truncated control frame")
    frame = pb.KVFrame()
    frame.ParseFromString(buffer[HEADER_PREFIX.size : HEADER_PREFIX.size + size].tobytes())
    return frame


def _ack_tag(sender_id: int) -> int:
    return (sender_id & _TAG_MASK) << 32


class UcxReceiver(ReceiverBase):
    """Decode side over UCX. Its endpoint is ``ucx://<hex of the UCX worker address>``."""

    scheme = "ucx"

    def __init__(self, *args: Any, host: str = "127.0.0.1", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._host = host
        self._peers: dict[int, Any] = {}  # sender_id -> ucxx endpoint back to the sender
        self._listen_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def _start_transport(self) -> None:
        ucxx = _ucxx(self._host)
        self._ucxx = ucxx
        self._endpoint = "ucx://" + bytes(ucxx.get_worker_address()).hex()
        self._listen_task = asyncio.create_task(self._listen())

    async def _close_transport(self) -> None:
        if self._listen_task is not None:
            self._listen_task.cancel()
            await asyncio.gather(self._listen_task, return_exceptions=True)
        for sender_id in list(self._peers):
            self._cut_peer(sender_id)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _cut_peer(self, peer: object) -> None:
        ep = self._peers.pop(peer, None) if isinstance(peer, int) else None
        if ep is not None:
            ep.abort(period=10**8)  # cancels receives posted on it: in-flight writes fail
        self.core.table.peer_lost(peer)

    async def _listen(self) -> None:
        while True:
            buffer = np.empty(MAX_CONTROL_BYTES, dtype=np.uint8)
            await self._ucxx.recv(buffer, CONTROL_TAG)
            try:
                frame = _unpack(buffer)
            except ValueError:
                continue  # not ours or corrupt: nobody to answer
            task = asyncio.create_task(self._serve(frame))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, frame: pb.KVFrame) -> None:
        sender_id = frame.sender_id
        kind = frame.WhichOneof("body")
        if kind == "hello":
            await self._hello(frame)
            return
        ep = self._peers.get(sender_id)
        if ep is None:
            # Unknown sender (never said hello, or cut): its payload, if any, is left
            # unmatched; the sender times out and reconnects.
            self.core.metrics.record_refused("KV_STATUS_UNKNOWN_RESERVATION")
            return
        if kind == "push":
            answer = await self._push(ep, frame, sender_id)
        elif kind == "renew":
            answer = self.core.renew(frame.renew, sender_id)
        elif kind == "abort":
            answer = self.core.abort(frame.abort)
        else:
            return
        await self._reply(sender_id, pb.KVFrame(seq=frame.seq, ack=answer))

    async def _hello(self, frame: pb.KVFrame) -> None:
        try:
            # As long as a sender waits for the reply by default (its connect gets a lease).
            wait_s = max(_ACK_TIMEOUT_S, self.core.table.default_lease_s)
            ep = await create_endpoint(
                self._ucxx,
                frame.hello.reply_address,
                asyncio.get_running_loop().time() + wait_s,
                f"endpoint back to KV sender {frame.sender_id}",
            )
        except Exception:
            return  # unreachable or malformed reply address: the sender's handshake times out
        reply = self.core.hello(frame.hello)
        if reply.status == pb.KV_STATUS_OK:
            old = self._peers.pop(frame.sender_id, None)
            if old is not None:
                old.abort(period=10**8)
            self._peers[frame.sender_id] = ep
        try:
            await asyncio.wait_for(
                ep.send(
                    _pack(pb.KVFrame(seq=frame.seq, hello_reply=reply)),
                    tag=_ack_tag(frame.sender_id),
                    force_tag=True,
                ),
                _ACK_TIMEOUT_S,
            )
        except Exception as e:
            _log.warning("KV peer %s cut: hello reply not sent (%r)", frame.sender_id, e)
            self._cut_peer(frame.sender_id)
        if reply.status != pb.KV_STATUS_OK:
            ep.abort(period=10**8)

    async def _push(self, ep: Any, frame: pb.KVFrame, sender_id: int) -> pb.KVAck:
        push = frame.push
        plan = self.core.begin_push(push, sender_id)
        if not isinstance(plan, PushPlan):
            return plan  # the sender has not sent the payload: nothing to drain
        ok = False
        try:
            receives = [
                asyncio.ensure_future(ep.recv(span, tag=push.payload_tag + k, force_tag=True))
                for k, span in enumerate(plan.spans)
            ]
            await asyncio.sleep(0)  # let each receive task post its tag_recv
            if receives:
                ready = pb.KVFrame(seq=frame.seq, ack=pb.KVAck(ready=True))
                await self._reply(sender_id, ready)
                await asyncio.gather(*receives)
            ok = True
        except Exception:
            pass  # canceled (peer cut) or failed: the blocks are not counted as received
        finally:
            answer = self.core.end_push(plan, ok)
        return answer

    async def _reply(self, sender_id: int, frame: pb.KVFrame) -> None:
        ep = self._peers.get(sender_id)
        if ep is None:
            return
        try:
            await asyncio.wait_for(
                ep.send(_pack(frame), tag=_ack_tag(sender_id), force_tag=True), _ACK_TIMEOUT_S
            )
        except Exception as e:
            _log.warning("KV peer %s cut: reply not sent (%r)", sender_id, e)
            self._cut_peer(sender_id)


class UcxChannel:
    """A sender's endpoint to one UCX receiver."""

    def __init__(self, ucxx: Any, ep: Any, sender_id: int) -> None:
        self._ucxx = ucxx
        self._ep = ep
        self._sender_id = sender_id
        self._loop = asyncio.get_running_loop()
        self._seq = itertools.count(1)
        self._tags = itertools.count(1)
        self._replies: dict[int, asyncio.Future[pb.KVFrame]] = {}
        self._error: Exception | None = None
        self._exchanges: set[asyncio.Future[pb.KVFrame]] = set()
        self._reader = asyncio.create_task(self._read_replies())

    @property
    def is_closed(self) -> bool:
        return self._error is not None

    async def call(
        self, frame: pb.KVFrame, payload: Sequence[np.ndarray], timeout: float
    ) -> pb.KVFrame:
        if self._error is not None:
            raise PeerLostError(str(self._error))
        # The exchange runs on its own: a caller cancelled half way (header sent, payload
        # not) must not abort the endpoint every other transfer shares, nor leave the
        # receiver's posted receives waiting. It ends by itself: with the reply (then
        # dropped), or at its deadline.
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
        frame.sender_id = self._sender_id
        if frame.WhichOneof("body") == "push":
            first = next(self._tags)
            for _ in range(len(payload) - 1):
                next(self._tags)
            frame.push.payload_tag = (self._sender_id << 32) | (first & _TAG_MASK)
        reply: asyncio.Future[pb.KVFrame] = self._loop.create_future()
        self._replies[seq] = reply
        payload_posted = False
        try:
            async with asyncio.timeout(timeout):
                await self._ep.send(_pack(frame), tag=CONTROL_TAG, force_tag=True)
                if not payload:
                    return await reply
                # A push: the receiver checks the header and posts its receives first.
                ready = await reply
                if not ready.ack.ready:
                    return ready  # refused: the payload is never sent
                reply = self._loop.create_future()
                self._replies[seq] = reply
                tag = frame.push.payload_tag
                payload_posted = True
                await asyncio.gather(
                    *(
                        self._ep.send(span, tag=tag + k, force_tag=True)
                        for k, span in enumerate(payload)
                    )
                )
                return await reply
        except TimeoutError as e:
            if payload_posted:
                # Sends may still be posted: abort the endpoint so UCX stops reading the pool.
                self._fail(TransferTimeoutError(f"no reply within {timeout:.1f}s"))
            # A control message alone reads only its own buffer: a late reply is dropped.
            raise TransferTimeoutError(f"no reply within {timeout:.1f}s") from e
        except asyncio.CancelledError:
            # Only close() cancels an exchange (it failed the channel first).
            self._fail(PeerLostError("channel closed"))
            raise
        except PeerLostError:
            raise
        except Exception as e:
            self._fail(e)
            raise PeerLostError(f"UCX send failed: {e}") from e
        finally:
            self._replies.pop(seq, None)

    async def handshake(self, hello: pb.KVHello, timeout: float) -> None:
        reply = await self.call(pb.KVFrame(hello=hello), [], timeout)
        if reply.WhichOneof("body") != "hello_reply":
            raise PeerLostError(f"expected a hello reply, got {reply.WhichOneof('body')}")
        if reply.hello_reply.status != pb.KV_STATUS_OK:
            await self.close()
            raise IncompatiblePeerError(reply.hello_reply.error)

    async def _read_replies(self) -> None:
        tag = _ack_tag(self._sender_id)
        try:
            while True:
                buffer = np.empty(MAX_CONTROL_BYTES, dtype=np.uint8)
                await self._ep.recv(buffer, tag=tag, force_tag=True)
                frame = _unpack(buffer)
                future = self._replies.get(frame.seq)
                if future is not None and not future.done():
                    future.set_result(frame)
        except asyncio.CancelledError:
            self._fail(PeerLostError("channel closed"))
        except Exception as e:
            self._fail(e)

    def _fail(self, error: Exception) -> None:
        if self._error is not None:
            return
        self._error = error
        for future in self._replies.values():
            if not future.done():
                future.set_exception(PeerLostError(f"connection lost: {error}"))
        with contextlib.suppress(Exception):
            self._ep.abort(period=10**8)

    async def close(self) -> None:
        self._fail(PeerLostError("channel closed"))
        self._reader.cancel()
        for exchange in list(self._exchanges):
            exchange.cancel()  # the endpoint is aborted: nothing more moves on it
        await asyncio.gather(self._reader, *self._exchanges, return_exceptions=True)


class UcxConnector:
    scheme = "ucx"

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host  # where this process's UCX listens (decode connects back to it)

    async def connect(self, endpoint: str, hello: pb.KVHello, timeout: float) -> UcxChannel:
        ucxx = _ucxx(self._host)
        try:
            address = bytes.fromhex(endpoint.removeprefix("ucx://"))
        except ValueError as e:
            raise ValueError(f"not a ucx endpoint: {endpoint!r}") from e
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            ep = await create_endpoint(ucxx, address, deadline, f"connecting to {endpoint[:40]}...")
        except TimeoutError:
            raise
        except Exception as e:  # e.g. UCXXShmemSegmentError: the peer's process is gone
            raise PeerLostError(f"cannot reach {endpoint[:40]}...: {e!r}") from e
        hello.reply_address = bytes(ucxx.get_worker_address())
        channel = UcxChannel(ucxx, ep, hello.sender_id)
        try:
            await channel.handshake(hello, timeout)
        except BaseException:
            await channel.close()  # its reader task and endpoint go with it
            raise
        return channel
