"""Writes a stream's messages, and a heartbeat whenever nothing was written for a while.

A request can produce nothing for a long time for good reasons (waiting for blocks, for its
KV, behind a long batch, preempted). The router cannot tell that from a stalled worker unless
the worker says so: while a stream is quiet, a heartbeat goes out every ``interval_s``. A
worker that stops (SIGSTOP, a hung process) stops both, and the router's stall timeout fires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

HEARTBEAT_S = 1.0


class HeartbeatWriter:
    """``async with HeartbeatWriter(context.write, heartbeat_message) as out: await
    out.write(message)``. Writes never interleave; heartbeats stop at exit."""

    def __init__(
        self,
        write: Callable[[Any], Any],
        heartbeat: Any,
        interval_s: float = HEARTBEAT_S,
        is_alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """``is_alive``: heartbeats only while it holds (e.g. the engine thread runs)."""
        self._write = write
        self._heartbeat = heartbeat
        self._interval_s = interval_s
        self._is_alive = is_alive
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._beats: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HeartbeatWriter:
        self._beats = asyncio.ensure_future(self._beat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._beats is not None:
            self._beats.cancel()
            with contextlib.suppress(BaseException):
                await self._beats

    async def write(self, message: Any) -> None:
        async with self._lock:
            await self._write(message)
            self._last = self._loop.time()

    async def _beat(self) -> None:
        while True:
            quiet = self._loop.time() - self._last
            if quiet < self._interval_s:
                await asyncio.sleep(self._interval_s - quiet)
                continue
            if self._is_alive():
                await self.write(self._heartbeat)
            else:
                await asyncio.sleep(self._interval_s)
