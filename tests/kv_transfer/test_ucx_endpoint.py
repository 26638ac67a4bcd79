"""A UCX endpoint's creation retries UCXX's own timeouts until the caller's deadline.

The retry policy (``retry_until``) runs here on plain coroutines: UCXX's timeout comes from its
progress thread being slow under load, which no test can bring about on demand. The binding to
ucxx (``create_endpoint``) runs against the real library.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from conftest import LoopThread

from kv_transfer import is_ucx_available
from kv_transfer.ucx_endpoint import create_endpoint, retry_until

# UCX is the optional ``pdserve[ucx]`` extra: an install without it has no ucxx to test against.
# CI installs it (tests/ci/requirements.py test ucx), so there these tests run.
needs_ucx = pytest.mark.skipif(
    not is_ucx_available(), reason="ucxx absent: the optional pdserve[ucx] extra is not installed"
)


class Slow(Exception):
    """Stands for UCXX's ``UCXTimedOutError``: the only error ``retry_until`` retries here."""


Outcome = str | BaseException


def _retry(
    aio: LoopThread, outcomes: list[Outcome], deadline_s: float, pause_s: float = 0.0
) -> tuple[Outcome, list[float]]:
    """``retry_until`` with a deadline ``deadline_s`` ahead, over an attempt that waits
    ``pause_s`` and then returns or raises the next of ``outcomes`` (the last one repeats).
    Returns what ``retry_until`` returned or raised, and the seconds each attempt was given."""

    async def run() -> tuple[Outcome, list[float]]:
        given: list[float] = []

        async def attempt(left: float) -> str:
            given.append(left)
            await asyncio.sleep(pause_s)
            outcome = outcomes[min(len(given), len(outcomes)) - 1]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        deadline = asyncio.get_running_loop().time() + deadline_s
        try:
            return await retry_until(deadline, attempt, Slow, "test"), given
        except Exception as e:
            return e, given

    return aio.run(run())


def test_a_timed_out_attempt_is_retried_with_what_is_left(aio: LoopThread) -> None:
    result, given = _retry(aio, [Slow("1"), Slow("2"), "endpoint"], 5.0, pause_s=0.05)
    assert result == "endpoint"
    assert len(given) == 3
    assert 4.0 < given[0] <= 5.0
    assert given[0] > given[1] > given[2]  # each attempt gets only what the deadline leaves


def test_the_deadline_ends_the_retries_with_a_timeout(aio: LoopThread) -> None:
    slow = [Slow(str(n)) for n in range(1, 11)]
    result, given = _retry(aio, list(slow), 1.0, pause_s=0.3)
    assert len(given) >= 2  # the first attempt's failure left time for another
    assert isinstance(result, TimeoutError)
    assert str(result).startswith(f"test: {len(given)} attempts timed out")
    assert result.__cause__ is slow[len(given) - 1]  # the last error, kept as the cause


def test_any_other_error_is_final(aio: LoopThread) -> None:
    result, given = _retry(aio, [ConnectionRefusedError("peer gone"), "endpoint"], 5.0)
    assert isinstance(result, ConnectionRefusedError)
    assert str(result) == "peer gone"
    assert len(given) == 1


def test_a_deadline_already_past_makes_no_attempt(aio: LoopThread) -> None:
    result, given = _retry(aio, ["endpoint"], -1.0)
    assert isinstance(result, TimeoutError)
    assert str(result) == "test: deadline passed after 0 attempts"
    assert given == []


@needs_ucx
def test_create_endpoint_reaches_a_real_ucx_worker(aio: LoopThread) -> None:
    """The endpoint is created through ucxx's own API (and the error retried is ucxx's): a
    tagged message sent on it arrives at the worker it names, this process's own."""
    import numpy as np

    from kv_transfer.ucx import _ucxx

    async def run() -> None:
        ucxx = _ucxx("127.0.0.1")
        assert issubclass(ucxx.exceptions.UCXTimedOutError, Exception)
        address = bytes(ucxx.get_worker_address())
        deadline = asyncio.get_running_loop().time() + 30.0
        ep = await create_endpoint(ucxx, address, deadline, "own worker")
        try:
            sent = np.arange(64, dtype=np.uint8)
            received = np.zeros(64, dtype=np.uint8)
            tag = 0x5445_5354_0000_0001  # no other test's tag
            arrival = asyncio.ensure_future(ucxx.recv(received, tag))
            await asyncio.wait_for(ep.send(sent, tag=tag, force_tag=True), 10.0)
            await asyncio.wait_for(arrival, 10.0)
            assert received.tolist() == sent.tolist()
        finally:
            ep.abort(period=10**8)

    aio.run(run())


@needs_ucx
def test_an_endpoint_made_after_its_caller_gave_up_is_aborted(
    aio: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """With a progress thread (ucxx's default) the endpoint is made off the event loop, so a
    deadline can cut the wait short; the endpoint that then arrives late is aborted."""
    from kv_transfer.ucx import _ucxx
    from kv_transfer.ucx_endpoint import _create_off_loop, _off_loop_steps

    async def run() -> None:
        ucxx = _ucxx("127.0.0.1")
        steps = _off_loop_steps(ucxx)
        assert steps is not None  # this ucxx's steps are the ones the module names
        address = ucxx.get_ucx_address_from_buffer(bytes(ucxx.get_worker_address()))
        with pytest.raises(TimeoutError):
            await _create_off_loop(steps, address, 0.0)  # gives up before the thread is back
        for _ in range(200):
            if any("aborted" in r.getMessage() for r in caplog.records):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the endpoint made late was not aborted")

    with caplog.at_level(logging.INFO, logger="kv_transfer.ucx_endpoint"):
        aio.run(run())
