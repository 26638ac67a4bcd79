"""``X-Request-Id`` on the HTTP server: a client's (or its gateway's) id for a request.

The completions endpoints take it as the request's id (``chatcmpl-<id>``, ``cmpl-<id>``: the
response's ``id``, the router's and workers' logs, the cluster's ledger), so one id follows the
request through every component, as vLLM's OpenAI server does with the same header. This
middleware sends the header back on the response (JSON, stream or error alike) when it is a
valid id (``request_ids.check_request_id``). A plain ASGI wrapper, not Starlette's
``BaseHTTPMiddleware``: streams and disconnect detection pass through as they are.
"""

from __future__ import annotations

from typing import Any

from router.errors import RequestError
from router.request_ids import check_request_id

HEADER = b"x-request-id"
ID_HEADER = "X-Request-Id"  # as errors name it


class RequestIdHeader:
    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        value = _valid_header(scope) if scope["type"] == "http" else None
        if value is None:
            await self._app(scope, receive, send)
            return

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if all(name.lower() != HEADER for name, _ in headers):
                    headers.append((HEADER, value))
                message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receive, send_with_id)


def _valid_header(scope: dict[str, Any]) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            try:
                check_request_id(value.decode("latin-1"), ID_HEADER)
            except RequestError:
                return None
            return bytes(value)
    return None
