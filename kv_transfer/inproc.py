"""In-process transport: sender and receiver pools in one process (colocated mode, tests).

Same messages, same checks, same reservation semantics as the network transports; the bytes
are one ``memcpy`` from the source pool into the destination pool. Endpoints are
``inproc://<name>``, registered while the receiver is started.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from kv_transfer.errors import IncompatiblePeerError, PeerLostError
from kv_transfer.receiver import PushPlan, ReceiverBase
from kv_transfer.reservations import PeerId
from protos.pdserve.v1 import kv_transfer_pb2 as pb

_registry: dict[str, InprocReceiver] = {}
_registry_lock = threading.Lock()
_names = itertools.count(1)


class InprocReceiver(ReceiverBase):
    """Decode side in this process; ``name`` defaults to a fresh unique one."""

    scheme = "inproc"

    def __init__(self, *args: Any, name: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._name = name or f"kv-{next(_names)}"

    async def _start_transport(self) -> None:
        with _registry_lock:
            if self._name in _registry:
                raise ValueError(f"inproc endpoint {self._name!r} already in use")
            _registry[self._name] = self
        self._endpoint = f"inproc://{self._name}"

    async def _close_transport(self) -> None:
        with _registry_lock:
            if _registry.get(self._name) is self:
                del _registry[self._name]

    def _cut_peer(self, peer: object) -> None:
        pass  # an in-process copy never stalls half way

    def handle(self, frame: pb.KVFrame, payload: Sequence[np.ndarray], peer: PeerId) -> pb.KVAck:
        kind = frame.WhichOneof("body")
        if kind == "push":
            plan = self.core.begin_push(frame.push, peer)
            if not isinstance(plan, PushPlan):
                return plan
            ok = False
            try:
                _copy(payload, plan.spans)
                ok = True
            finally:
                answer = self.core.end_push(plan, ok)
            return answer
        if kind == "renew":
            return self.core.renew(frame.renew, peer)
        if kind == "abort":
            return self.core.abort(frame.abort)
        raise ValueError(f"unexpected {kind} frame")


def _copy(sources: Sequence[np.ndarray], destinations: Sequence[np.ndarray]) -> None:
    # Sender segments and receiver spans cut the same bytes at the same places
    # (engine.kv_cache_spec.segment_runs).
    if len(sources) != len(destinations):
        raise ValueError("payload segments do not match the push")
    for src, dst in zip(sources, destinations, strict=True):
        np.copyto(dst, src.reshape(-1).view(np.uint8))


class InprocChannel:
    def __init__(self, name: str, peer: PeerId) -> None:
        self._name = name
        self._peer = peer
        self._closed = False

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _receiver(self) -> InprocReceiver:
        receiver = _registry.get(self._name)
        if receiver is None or self._closed:
            raise PeerLostError(f"inproc endpoint {self._name!r} is gone")
        return receiver

    async def call(
        self, frame: pb.KVFrame, payload: Sequence[np.ndarray], timeout: float
    ) -> pb.KVFrame:
        answer = self._receiver().handle(frame, payload, self._peer)
        await asyncio.sleep(0)  # let other requests' pushes interleave, as on a network
        return pb.KVFrame(seq=frame.seq, ack=answer)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            receiver = _registry.get(self._name)
            if receiver is not None:
                receiver.core.table.peer_lost(self._peer)


class InprocConnector:
    scheme = "inproc"

    def __init__(self) -> None:
        self._peers = itertools.count(1)

    async def connect(self, endpoint: str, hello: pb.KVHello, timeout: float) -> InprocChannel:
        name = endpoint.removeprefix("inproc://")
        receiver = _registry.get(name)
        if receiver is None:
            raise PeerLostError(f"no inproc receiver named {name!r}")
        reply = receiver.core.hello(hello)
        if reply.status != pb.KV_STATUS_OK:
            raise IncompatiblePeerError(reply.error)
        return InprocChannel(name, ("inproc", id(self), next(self._peers)))
