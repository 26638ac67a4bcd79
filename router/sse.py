"""A server-sent-events response that always cleans up: on completion, on an error, and when
the client goes away while the stream is idle (waiting in the queue, or between tokens)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client closes the connection (the request body is already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class SSEResponse(StreamingResponse):
    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Unlike StreamingResponse under ASGI 2.4, watch for a disconnect even while no chunk
        # is being written, so an abandoned request is aborted without waiting for a token.
        body = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({body, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (body, watcher):
                task.cancel()
            results = await asyncio.gather(body, watcher, return_exceptions=True)
            await self._on_close()
        err = results[0]
        if isinstance(err, Exception) and not isinstance(err, OSError):
            raise err  # a bug, not a disconnect: let the server log it
