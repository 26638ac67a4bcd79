"""A UCX endpoint's creation retries UCXX's own timeouts until the caller's deadline.

The retry policy (``retry_until``) runs here on plain coroutines: UCXX's timeout comes from its
progress thread being slow under load, which no test can bring about on demand. The binding to
ucxx (``create_endpoint``) runs against the real library.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import LoopThread

from kv_transfer import is_ucx_available
from kv_transfer.ucx_endpoint import create_endpoint, retry_until


class Slow(Exception):
    """Stands for UCXX's ``UCXTimedOutError``: the only error ``retry_until`` retries here."""


def test_a_timed_out_attempt_is_retried_with_what_is_left(aio: LoopThread) -> None:
    async def run() -> list[float]:
        calls: list[float] = []

        async def attempt(left: float) -> str:
            calls.append(left)
            await asyncio.sleep(0.05)
            if len(calls) <= 2:
                raise Slow(f"attempt {len(calls)}")
            return "endpoint"

        loop = asyncio.get_running_loop()
        assert await retry_until(loop.time() + 5.0, attempt, Slow, "test") == "endpoint"
        return calls

    calls = aio.run(run())
    assert len(calls) == 3
    assert 4.8 < calls[0] <= 5.0
    assert calls[0] > calls[1] > calls[2]  # each attempt gets only what the deadline leaves


def test_the_deadline_ends_the_retries_with_a_timeout(aio: LoopThread) -> None:
    async def run() -> None:
        calls: list[float] = []

        async def attempt(left: float) -> str:
            calls.append(left)
            await asyncio.sleep(0.1)
            raise Slow(f"attempt {len(calls)}")

        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError, match="test: 3 attempts timed out") as info:
            await retry_until(loop.time() + 0.25, attempt, Slow, "test")
        assert isinstance(info.value.__cause__, Slow)  # the last error, kept as the cause
        assert str(info.value.__cause__) == "attempt 3"
        assert len(calls) == 3

    aio.run(run())


def test_any_other_error_is_final(aio: LoopThread) -> None:
    async def run() -> None:
        calls: list[float] = []

        async def attempt(left: float) -> str:
            calls.append(left)
            raise ConnectionRefusedError("peer gone")

        loop = asyncio.get_running_loop()
        with pytest.raises(ConnectionRefusedError, match="peer gone"):
            await retry_until(loop.time() + 5.0, attempt, Slow, "test")
        assert len(calls) == 1

    aio.run(run())


def test_a_deadline_already_past_makes_no_attempt(aio: LoopThread) -> None:
    async def run() -> None:
        calls: list[float] = []

        async def attempt(left: float) -> str:
            calls.append(left)
            return "endpoint"

        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError, match="deadline passed after 0 attempts"):
            await retry_until(loop.time() - 1.0, attempt, Slow, "test")
        assert calls == []

    aio.run(run())


@pytest.mark.skipif(not is_ucx_available(), reason="ucxx not installed")
def test_create_endpoint_reaches_a_real_ucx_worker(aio: LoopThread) -> None:
    """The endpoint is created through ucxx's own API, and the error it retries is ucxx's."""
    from kv_transfer.ucx import _ucxx

    async def run() -> None:
        ucxx = _ucxx("127.0.0.1")
        assert issubclass(ucxx.exceptions.UCXTimedOutError, Exception)
        address = bytes(ucxx.get_worker_address())
        deadline = asyncio.get_running_loop().time() + 30.0
        ep = await create_endpoint(ucxx, address, deadline, "own worker")
        try:
            assert ep.uid is not None
        finally:
            ep.abort(period=10**8)

    aio.run(run())
