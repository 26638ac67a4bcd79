"""router/request_ids.py: what a client's request id may be; one stream per request id; a
request whose id is held by a stream that is closing waits for that stream's clean-up instead of
being refused (a client's retry right after its cancel), and is refused when the holder is live
or does not let go in time."""

from __future__ import annotations

import asyncio

import pytest

from router.errors import ErrorKind, RequestError
from router.request_ids import MAX_REQUEST_ID_CHARS, IdHold, InFlightIds, check_request_id


def _refused(e: pytest.ExceptionInfo[RequestError]) -> None:
    assert e.value.kind == ErrorKind.CONFLICT
    assert e.value.param == "request_id"
    assert "request_id: request 'r' is already in flight" in str(e.value)


def test_a_live_holder_refuses_at_once_and_a_released_id_is_free() -> None:
    async def main() -> None:
        ids = InFlightIds(closing_wait_s=30)
        hold = await ids.acquire("r")
        started = asyncio.get_running_loop().time()
        with pytest.raises(RequestError) as e:
            await ids.acquire("r")
        _refused(e)
        assert asyncio.get_running_loop().time() - started < 1  # not waited for
        ids.release("r", hold)
        assert "r" not in ids
        again = await ids.acquire("r")
        ids.release("r", hold)  # a stale release leaves the new holder alone
        assert "r" in ids
        ids.release("r", again)
        assert "r" not in ids

    asyncio.run(main())


async def _closing_holder(closing_wait_s: float) -> tuple[InFlightIds, IdHold]:
    """Ids where "r" is held by a stream that is closing (its clean-up under way)."""
    ids = InFlightIds(closing_wait_s=closing_wait_s)
    hold = await ids.acquire("r")
    hold.closing = True
    return ids, hold


def test_a_retry_waits_for_a_closing_holder_and_gets_the_id() -> None:
    async def main() -> None:
        ids, hold = await _closing_holder(closing_wait_s=30)
        retry = asyncio.create_task(ids.acquire("r"))
        await asyncio.sleep(0.2)
        assert not retry.done()  # waiting for the clean-up, not refused
        ids.release("r", hold)
        new_hold = await asyncio.wait_for(retry, 5)
        assert new_hold is not hold and not new_hold.closing and "r" in ids
        ids.release("r", new_hold)

    asyncio.run(main())


def test_only_one_of_two_waiting_retries_gets_the_id() -> None:
    async def main() -> None:
        ids, hold = await _closing_holder(closing_wait_s=30)
        retries = [asyncio.create_task(ids.acquire("r")) for _ in range(2)]
        await asyncio.sleep(0.1)
        ids.release("r", hold)
        done = await asyncio.gather(*retries, return_exceptions=True)
        held = [d for d in done if not isinstance(d, BaseException)]
        refused = [d for d in done if isinstance(d, RequestError)]
        assert len(held) == 1 and len(refused) == 1, done
        assert refused[0].kind == ErrorKind.CONFLICT
        ids.release("r", held[0])

    asyncio.run(main())


@pytest.mark.parametrize("bound", ["closing_wait_s", "deadline"])
def test_a_closing_holder_that_does_not_let_go_in_time_refuses(bound: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ids, hold = await _closing_holder(closing_wait_s=0.3 if bound == "closing_wait_s" else 30)
        started = loop.time()
        deadline = started + 0.3 if bound == "deadline" else None
        with pytest.raises(RequestError) as e:
            await ids.acquire("r", deadline)
        _refused(e)
        assert 0.25 <= loop.time() - started < 5
        assert "r" in ids  # still the closing holder's
        ids.release("r", hold)

    asyncio.run(main())


def test_request_ids_are_bounded_and_printable() -> None:
    for good in ("r", "chatcmpl-0f3a", "é✓ with spaces", "k" * MAX_REQUEST_ID_CHARS):
        check_request_id(good)
    for bad, message in [
        ("k" * (MAX_REQUEST_ID_CHARS + 1), "request_id is 257 characters; at most 256"),
        ("tab\there", "it holds '\\t'"),
        ("cr\r", "it holds '\\r'"),
        ("zero\u200bwidth", "it holds '\\u200b'"),
    ]:
        with pytest.raises(RequestError) as e:
            check_request_id(bad)
        assert e.value.kind == ErrorKind.INVALID and e.value.param == "request_id"
        assert message in str(e.value), str(e.value)
    with pytest.raises(RequestError) as e:
        check_request_id("\n", "X-Request-Id")
    assert e.value.param == "X-Request-Id" and "X-Request-Id must be printable" in str(e.value)
