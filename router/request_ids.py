"""Request ids: what a client's may be, and the ids the router has a stream open for (one
stream per id at a time).

The backends key a request's calls and aborts by its id (the colocated engine too), so two
streams with one id would clean up each other's. A second request with an id in flight is
refused with CONFLICT, unless the stream holding the id is already closing (its client
cancelled or left, its deadline passed, it failed): then the new request waits, for at most
``closing_wait_s``, for that stream's clean-up to let go of the id. A client that cancels and
at once retries with the same id (an idempotency key, a retry after its own timeout) gets its
retry served rather than refused because the cancel's clean-up was still under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from router.errors import ErrorKind, RequestError

CLOSING_WAIT_S = 10.0  # how long a request waits for a closing stream to free its id
MAX_REQUEST_ID_CHARS = 256  # a UUID is 36, an idempotency key (Stripe's) at most 255


def check_request_id(request_id: str, field: str = "request_id") -> None:
    """A client's request id: at most ``MAX_REQUEST_ID_CHARS`` printable characters (it names
    the request in logs, the cluster's ledger and the KV transfer's frames). Raises
    RequestError(INVALID) naming ``field``."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise RequestError(
            ErrorKind.INVALID,
            f"{field} is {len(request_id)} characters; at most {MAX_REQUEST_ID_CHARS}",
            field,
        )
    if not request_id.isprintable():
        bad = next(c for c in request_id if not c.isprintable())
        raise RequestError(
            ErrorKind.INVALID,
            f"{field} must be printable characters (no control characters or line breaks); "
            f"it holds {bad!r}",
            field,
        )


@dataclasses.dataclass
class IdHold:
    """One stream's hold on its id; the stream sets ``closing`` once it has stopped reading
    outputs, before its clean-up."""

    released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    closing: bool = False


class InFlightIds:
    def __init__(self, closing_wait_s: float = CLOSING_WAIT_S) -> None:
        self.closing_wait_s = closing_wait_s
        self._holds: dict[str, IdHold] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._holds

    async def acquire(
        self, request_id: str, deadline: float | None = None, field: str = "request_id"
    ) -> IdHold:
        """Hold ``request_id`` for a new stream; ``release`` lets go of it.

        Raises RequestError CONFLICT, naming ``field`` (where the client gave the id), while a
        stream that is not closing holds it, or when a closing one has not let go of it within
        ``closing_wait_s`` (or by ``deadline``, an event-loop time).
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + self.closing_wait_s
        if deadline is not None:
            until = min(until, deadline)
        while (held := self._holds.get(request_id)) is not None:
            remaining = until - loop.time()
            if not held.closing or remaining <= 0:
                raise _conflict(request_id, field)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await held.released.wait()
        hold = IdHold()
        self._holds[request_id] = hold
        return hold

    def release(self, request_id: str, hold: IdHold) -> None:
        if self._holds.get(request_id) is hold:
            del self._holds[request_id]
        hold.released.set()


def _conflict(request_id: str, field: str) -> RequestError:
    how = "leave it empty" if field == "request_id" else "leave it out"
    return RequestError(
        ErrorKind.CONFLICT,
        f"{field}: request {request_id!r} is already in flight: give each request its own "
        f"id (or {how} for the router to make one)",
        field,
    )
