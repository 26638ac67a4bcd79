"""Remote-prefill requests waiting for decode KV blocks, served in arrival order.

A request that finds no room for its prompt's blocks does not fail: it waits here until
running requests finish (or reservations end) and free enough. The engine thread serves the
queue after every step and every batch of commands (``AsyncEngine``'s ``on_step`` hook), so
blocks freed by an abort reach the head at once::

    Generate ─▶ reserve(): enqueue ─▶ serve() on the engine thread ─▶ head fits? reserve it,
                                        (also after every step)       resolve its future
                                                                     head does not fit: wait

First come, first served: a request behind a head that does not fit waits too, so a large
prompt is never starved by small ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.outputs import RemotePrefillReservation

Reserve = Callable[[LLMEngine], RemotePrefillReservation | None]


@dataclass
class _Waiting:
    reserve: Reserve
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[RemotePrefillReservation]


class BlockQueue:
    """Thread-safe: ``reserve`` runs on an event loop, ``serve`` on the engine thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    async def reserve(
        self, engine: AsyncEngine, request_id: str, reserve: Reserve
    ) -> RemotePrefillReservation:
        """The request's reservation, made by ``reserve(engine)`` on the engine thread as
        soon as it is this request's turn and its blocks fit. Raises ValueError (from
        ``reserve``) for a bad request. A caller cancelled here may still have been given
        blocks: it must ``engine.abort(request_id)`` (the abort runs after the reservation)."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(reserve, loop, loop.create_future())
        with self._lock:
            if request_id in self._waiting:
                raise ValueError(f"request_id {request_id!r} is already waiting for blocks")
            self._waiting[request_id] = waiting
        try:
            await engine.call(self.serve)  # the head may fit now
            return await waiting.future
        finally:
            with self._lock:
                if self._waiting.get(request_id) is waiting:
                    del self._waiting[request_id]

    def serve(self, engine: LLMEngine) -> None:
        """Engine thread: reserve for the head of the queue while its blocks fit."""
        while True:
            with self._lock:
                if not self._waiting:
                    return
                request_id, head = next(iter(self._waiting.items()))
            try:
                result: RemotePrefillReservation | Exception | None = head.reserve(engine)
            except ValueError as e:
                result = e
            if result is None:
                return  # no room for the head yet: everyone behind it waits too
            with self._lock:
                taken = self._waiting.get(request_id) is head
                if taken:
                    del self._waiting[request_id]
            if not taken:  # its caller gave up while the blocks were being reserved
                if not isinstance(result, Exception):
                    engine.abort_request(request_id)
                continue
            _settle(head, result)


def _settle(waiting: _Waiting, result: RemotePrefillReservation | Exception) -> None:
    def settle() -> None:
        if waiting.future.done():
            return  # the caller was cancelled: it aborts the request itself
        if isinstance(result, Exception):
            waiting.future.set_exception(result)
        else:
            waiting.future.set_result(result)

    try:
        waiting.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass
