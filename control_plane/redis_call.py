"""One control-plane call to Redis, bounded and classified.

Any Redis failure (refused, reset, timed out, a script error) raises ``ControlPlaneUnavailable``;
callers keep serving on what they last knew and try again. A connection that broke under the
call raises its subclass ``ConnectionLost``: the command may never have reached Redis (a
connection Redis closed while it sat in the pool), so a call that is safe to repeat can be made
once more on a fresh connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

T = TypeVar("T")


class ControlPlaneUnavailable(Exception):
    """Redis did not answer in time or failed; the message says how."""


class ConnectionLost(ControlPlaneUnavailable):
    """The connection broke under the call (not a timeout, not an error reply)."""


async def call_once(op: Awaitable[T], url: str) -> T:
    """Await one Redis call. Its bound is the client's own: every socket connect, write and
    read has the client's timeout. No asyncio timeout is stacked on top: nested asyncio timeouts
    around redis-py's own wait_for left a cancelled task stuck in a socket drain on Python 3.11.
    """
    task = asyncio.current_task()
    try:
        result = await op
    except (TimeoutError, RedisError, OSError) as e:
        if task is not None and task.cancelling():
            raise asyncio.CancelledError from e
        message = f"redis at {url}: {type(e).__name__}: {e}"
        if isinstance(e, RedisConnectionError | ConnectionError):
            raise ConnectionLost(message) from e
        raise ControlPlaneUnavailable(message) from e
    if task is not None and task.cancelling():
        # redis-py may absorb a cancellation that lands mid-command (it finishes the command
        # to keep the connection usable) and return normally, or turn it into a connection
        # error: either way the caller was cancelled and must see it.
        raise asyncio.CancelledError
    return result
