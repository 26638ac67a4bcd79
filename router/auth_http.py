"""API keys on the HTTP server: a plain ASGI middleware in front of the FastAPI app.

A request without an accepted key gets 401 with OpenAI's error body and
``WWW-Authenticate: Bearer`` before the app sees it (no body is read). A plain ASGI wrapper,
not Starlette's ``BaseHTTPMiddleware``: streams and disconnect detection pass through as they
are.
"""

from __future__ import annotations

import json
from typing import Any

from router.auth import Authenticator, AuthFailure
from router.auth_metrics import AuthMetrics

Scope = dict[str, Any]


def unauthorized_body(failure: AuthFailure) -> dict[str, Any]:
    """OpenAI's 401 body: ``code`` is ``invalid_api_key`` for a wrong key, null otherwise."""
    return {
        "error": {
            "message": failure.message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key" if failure is AuthFailure.INVALID else None,
        }
    }


class ApiKeyMiddleware:
    def __init__(self, app: Any, auth: Authenticator, metrics: AuthMetrics) -> None:
        self._app = app
        self._auth = auth
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        failure = self._auth.check(scope.get("path", ""), header)
        if failure is None:
            await self._app(scope, receive, send)
            return
        self._metrics.failed("http", failure)
        body = json.dumps(unauthorized_body(failure)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="pdserve"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
