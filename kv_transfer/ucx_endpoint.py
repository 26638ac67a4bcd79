"""A UCX endpoint to a worker address, with UCXX's own timeouts retried until a deadline.

When a progress thread runs (ucxx's default), UCXX creates an endpoint on that thread and waits
for it: three times 3 s, then it raises ``UCXTimedOutError`` ("Timeout waiting for
ucp_ep_create"). On a loaded machine the thread can be that slow to come round while the peer
is alive and well: it happened once in a full test run on a 2-core VM, where the next attempt
would have found the thread free. So that error is retried while the caller's deadline is
ahead; any other failure (``UCXShmemSegmentError``: the peer's process is gone) is final.

The creation runs on the event loop's thread and holds it while UCXX waits (up to ~9 s an
attempt): ucxx's asyncio API has no way to give up sooner. A new attempt starts only before
the deadline, so a connection gives up at most one attempt's wait after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

_log = logging.getLogger(__name__)
T = TypeVar("T")


async def retry_until(
    deadline: float,
    attempt: Callable[[float], Awaitable[T]],
    retryable: type[BaseException],
    what: str,
) -> T:
    """``await attempt(seconds_left)`` until it returns, retrying ``retryable`` errors while
    ``deadline`` (event-loop time) is ahead. Raises ``TimeoutError`` (from the last error) when
    the deadline passes; any other error at once."""
    loop = asyncio.get_running_loop()
    attempts = 0
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise TimeoutError(f"{what}: deadline passed after {attempts} attempts")
        attempts += 1
        try:
            return await attempt(left)
        except retryable as e:
            if deadline - loop.time() <= 0:
                raise TimeoutError(f"{what}: {attempts} attempts timed out ({e!r})") from e
            _log.warning("%s: attempt %d timed out (%r); retrying", what, attempts, e)


async def create_endpoint(ucxx: Any, address: bytes, deadline: float, what: str) -> Any:
    """An endpoint (no error handling: shared memory between local processes) to the UCX
    worker whose address is ``address``, by ``deadline`` (event-loop time)."""

    async def attempt(left: float) -> Any:
        return await asyncio.wait_for(
            ucxx.create_endpoint_from_worker_address(
                ucxx.get_ucx_address_from_buffer(address), endpoint_error_handling=False
            ),
            left,
        )

    return await retry_until(deadline, attempt, ucxx.exceptions.UCXTimedOutError, what)
