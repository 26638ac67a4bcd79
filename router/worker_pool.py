"""The router's view of one pool of workers (prefill or decode): channels, polled load, health.

Each worker is polled by its own task (``GetLoad`` every ``poll_s``, with a deadline), so a
stalled worker delays only its own status. A worker is *healthy* while it answers; *routable*
while healthy and not draining. Only healthy workers' loads count: a dead worker's last
report does not linger in ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from pdserve.tls import ClientTls, open_channel
from protos.pdserve.v1 import worker_pb2 as wpb
from router.errors import ErrorKind, RequestError

POLL_TIMEOUT_S = 2.0  # a worker that does not answer GetLoad within this is unhealthy


@dataclass
class Worker:
    role: str  # "prefill" | "decode"
    target: str
    channel: grpc.aio.Channel
    stub: Any
    load: wpb.WorkerLoad | None = None
    healthy: bool = False

    @property
    def is_routable(self) -> bool:
        return self.healthy and not (self.load is not None and self.load.draining)


class WorkerPool:
    """Workers of one role; every method runs on the router's event loop."""

    def __init__(
        self,
        role: str,
        targets: Sequence[str],
        stub_cls: Callable[[Any], Any],
        poll_s: float,
        tls: ClientTls | None = None,
    ) -> None:
        """``tls``: dial the workers over mutual TLS (pdserve.tls)."""
        self.role = role
        self._tls = tls
        self._targets = list(targets)
        self._stub_cls = stub_cls
        self._poll_s = poll_s
        self.workers: list[Worker] = []
        self._pollers: list[asyncio.Task[None]] = []
        self._rr = itertools.count()

    async def start(self) -> None:
        """Open the channels, poll every worker once, then keep polling in the background."""
        for target in self._targets:
            channel = open_channel(target, self._tls)
            self.workers.append(Worker(self.role, target, channel, self._stub_cls(channel)))
        await asyncio.gather(*(self._poll(w) for w in self.workers))
        self._pollers = [asyncio.create_task(self._poll_forever(w)) for w in self.workers]

    async def close(self) -> None:
        for task in self._pollers:
            task.cancel()
        for task in self._pollers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for w in self.workers:
            await w.channel.close()

    @property
    def num_healthy(self) -> int:
        return sum(w.healthy for w in self.workers)

    def loads(self) -> list[wpb.WorkerLoad]:
        """The last load of every healthy worker."""
        return [w.load for w in self.workers if w.healthy and w.load is not None]

    def routable(self) -> list[Worker]:
        """Healthy, not draining workers. Raises RequestError(UNAVAILABLE) when there are
        none: a request that needs this pool cannot be served now."""
        workers = [w for w in self.workers if w.is_routable]
        if not workers:
            raise RequestError(
                ErrorKind.UNAVAILABLE,
                f"no {self.role} worker is available ({len(self.workers)} configured, "
                f"{self.num_healthy} answering, none accepting requests)",
            )
        return workers

    def pick(self, workers: list[Worker], key: Callable[[wpb.WorkerLoad], Any]) -> Worker:
        """The worker with the smallest ``key(load)``; round robin while no load is known."""
        with_load = [w for w in workers if w.load is not None]
        if not with_load:
            return workers[next(self._rr) % len(workers)]
        return min(with_load, key=lambda w: key(w.load))  # type: ignore[arg-type]

    @staticmethod
    def mark_stalled(worker: Worker) -> None:
        """A request saw ``worker`` stall: route nothing new there until it answers a poll."""
        worker.healthy = False

    async def _poll(self, w: Worker) -> None:
        try:
            w.load = await w.stub.GetLoad(wpb.GetLoadRequest(), timeout=POLL_TIMEOUT_S)
            w.healthy = True
        except grpc.aio.AioRpcError:
            w.healthy = False

    async def _poll_forever(self, w: Worker) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            await self._poll(w)
