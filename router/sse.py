"""A server-sent-events response that always cleans up: on completion, on an error, and when
the client goes away while the stream is idle (waiting in the queue, or between tokens); and
that keeps a silent stream open through proxies.

A streaming request sends nothing between its headers and its first token, which under load
may be minutes in the queue; proxies and load balancers close a response that is silent for
their idle timeout (ingress-nginx's and AWS ALB's default: 60 s), failing a request that was
only waiting. An SSE comment line (``: keep-alive``) after each quiet ``keepalive_s`` keeps the
connection busy, as Text Generation Inference and sse-starlette send them. The SSE spec has
clients skip comments, and the openai SDK does; vLLM's ``vllm bench serve`` client (0.32) does
not: it strips each network chunk of its line ends before splitting events, so a comment glues
itself to every later event and the request fails (measured: 2 of 48 in issue 18's serving
run). Off by default, then: a deployment behind such a proxy turns it on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

KEEPALIVE = ": keep-alive\n\n"


async def with_keepalive(events: AsyncIterator[str], every_s: float) -> AsyncIterator[str]:
    """``events``, with ``KEEPALIVE`` after each ``every_s`` (> 0) seconds none came.
    ``events`` is left open for its owner to close."""
    pending: asyncio.Future[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield KEEPALIVE
                continue
            next_event, pending = pending, None
            try:
                event = next_event.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None:  # closed while waiting: stop that step of ``events`` first
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client closes the connection (the request body is already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class SSEResponse(StreamingResponse):
    def __init__(
        self,
        events: AsyncIterator[str],
        on_close: Callable[[], Awaitable[None]],
        keepalive_s: float = 0.0,
    ) -> None:
        """``on_close`` runs once the stream ended, however; ``keepalive_s``: see the module."""
        super().__init__(
            with_keepalive(events, keepalive_s) if keepalive_s > 0 else events,
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
