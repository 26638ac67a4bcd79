"""A UCX endpoint to a worker address, with UCXX's own timeouts retried until a deadline.

When a progress thread runs (ucxx's default), UCXX creates an endpoint on that thread and waits
for it: three times 3 s, then it raises ``UCXTimedOutError`` ("Timeout waiting for
ucp_ep_create"). On a loaded machine the thread can be that slow to come round while the peer
is alive and well: it happened once in a full test run on a 2-core VM, where the next attempt
would have found the thread free. So that error is retried while the caller's deadline is
ahead; any other failure (``UCXShmemSegmentError``: the peer's process is gone) is final.

ucxx's asyncio call creates the endpoint synchronously, holding the event loop for as long as
UCXX waits (up to ~9 s an attempt), and no timeout can cut it short. With a progress thread,
the same steps run here on a worker thread instead (``_create_off_loop``), so the event loop
keeps serving and the deadline holds; an attempt the deadline cuts short is abandoned, and the
endpoint it creates late is aborted. The steps are ucxx's own but not its public API: where
this ucxx lays them out otherwise, or runs without a progress thread, the public call is used.
"""

from __future__ import annotations

import asyncio
import functools
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
    off_loop = _off_loop_steps(ucxx)
    ucx_address = ucxx.get_ucx_address_from_buffer(address)

    async def attempt(left: float) -> Any:
        if off_loop is not None:
            return await _create_off_loop(off_loop, ucx_address, left)
        return await asyncio.wait_for(
            ucxx.create_endpoint_from_worker_address(ucx_address, endpoint_error_handling=False),
            left,
        )

    return await retry_until(deadline, attempt, ucxx.exceptions.UCXTimedOutError, what)


def _off_loop_steps(ucxx: Any) -> tuple[Any, Any, Any] | None:
    """(application context, raw endpoint class, endpoint wrapper) where ucxx has them as
    ``create_endpoint_from_worker_address`` uses them and runs a progress thread; else None."""
    try:
        from ucxx._lib.libucxx import UCXEndpoint
        from ucxx._lib_async.endpoint import Endpoint

        ctx = ucxx.core._get_ctx()
        thread_mode = str(ctx.progress_mode).startswith("thread")
        create = UCXEndpoint.create_from_worker_address
    except (ImportError, AttributeError):
        return None
    return (ctx, create, Endpoint) if thread_mode else None


async def _create_off_loop(steps: tuple[Any, Any, Any], ucx_address: Any, left: float) -> Any:
    """ucxx's ``create_endpoint_from_worker_address``, its blocking step on a worker thread,
    given up after ``left`` seconds (``TimeoutError``)."""
    ctx, create, wrapper = steps
    ctx.continuous_ucx_progress()  # as ucxx's own call does (a no-op once started)
    made = asyncio.get_running_loop().run_in_executor(None, create, ctx.worker, ucx_address, False)
    try:
        raw = await asyncio.wait_for(asyncio.shield(made), left)
    except BaseException:
        made.add_done_callback(functools.partial(_abort_late, ctx, wrapper))
        raise
    return wrapper(endpoint=raw, ctx=ctx, tags=None)


def _abort_late(ctx: Any, wrapper: Any, made: asyncio.Future[Any]) -> None:
    """Aborts the endpoint an abandoned attempt created after all (nothing if it failed)."""
    if made.cancelled() or made.exception() is not None:
        return
    wrapper(endpoint=made.result(), ctx=ctx, tags=None).abort(period=10**8)
    _log.info("UCX endpoint created after its caller gave up: aborted")
