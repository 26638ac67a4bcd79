"""The protocol-independent request flow both front ends share.

```
 gRPC / HTTP handler
   check_model ─▶ prepare (params, tokenize, length) ─▶ admit (slot) ─▶ stream (deadline)
        │               │                                   │                │
     NOT_FOUND       INVALID                              BUSY     TIMEOUT / INTERNAL
```

Every refusal is a ``RequestError``; a stream that ends early for any reason (deadline,
cancellation, disconnect, an error) aborts the backend request, freeing its blocks.

Draining (``begin_drain``, on SIGTERM): new requests are refused with UNAVAILABLE; those in
flight get the grace, then fail with UNAVAILABLE "shutting down" — an error the front ends
put in the stream, never a silent cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from router.admission import Admission, AdmissionRejected, Slot
from router.backend import Backend, GenerateRequest
from router.errors import ErrorKind, RequestError, invalid_argument, unknown_model
from router.metrics import RouterMetrics

logger = logging.getLogger(__name__)


class Router:
    def __init__(
        self, backend: Backend, admission: Admission, metrics: RouterMetrics | None = None
    ) -> None:
        self.backend = backend
        self.admission = admission
        self.model_name = backend.model_info().model
        self.metrics = metrics or RouterMetrics("router", self.model_name)
        self.metrics.watch(admission, backend)
        self._drain_deadline: float | None = None  # event-loop time; set while draining
        self._grace_s = 0.0
        self._waits: set[asyncio.Timeout] = set()  # every stream's current wait for output

    @property
    def is_draining(self) -> bool:
        return self._drain_deadline is not None

    def begin_drain(self, grace_s: float) -> None:
        """Refuse new requests from now on; requests in flight fail ``grace_s`` from now
        unless they finish first (call on the event loop)."""
        self._grace_s = grace_s
        self._drain_deadline = asyncio.get_running_loop().time() + grace_s
        for wait in self._waits:
            when = wait.when()
            if when is None or when > self._drain_deadline:
                with contextlib.suppress(RuntimeError):  # it is expiring already
                    wait.reschedule(self._drain_deadline)

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is in flight; False when ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.admission.num_inflight > 0:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def check_model(self, requested: str | None) -> None:
        """An empty or missing model name means the served one."""
        if requested and requested != self.model_name:
            raise unknown_model(requested, self.model_name)

    def prepare(
        self,
        params: SamplingParams,
        prompt: str | Sequence[int] | None = None,
        messages: list[dict[str, Any]] | None = None,
        priority: int = 0,
        request_id: str | None = None,
        id_prefix: str = "req",
    ) -> GenerateRequest:
        """Tokenize the prompt (text, token ids or chat messages) and check it fits the model.

        Raises RequestError(INVALID) naming the field. Tokenizing here (not in the engine)
        lets the router route by prompt blocks and refuse an oversize prompt before any
        response is started.
        """
        arrival_time = time.monotonic()
        field = "messages" if messages is not None else "prompt"
        info = self.backend.model_info()
        try:
            if messages is not None:
                ids = self.backend.render_chat(messages)
            elif isinstance(prompt, str):
                ids = self.backend.tokenize(prompt)
            elif prompt is not None:
                ids = list(prompt)
                for t in ids:
                    if (
                        isinstance(t, bool)
                        or not isinstance(t, int)
                        or not 0 <= t < info.vocab_size
                    ):
                        raise ValueError(
                            f"prompt: token ids must be integers in [0, {info.vocab_size}), "
                            f"got {t!r}"
                        )
            else:
                raise ValueError("prompt: give a text prompt or token ids")
            if not ids:
                raise ValueError(f"{field} must not be empty")
            if len(ids) >= info.max_model_len:
                raise ValueError(
                    f"{field} is {len(ids)} tokens; it must be shorter than the model's "
                    f"max_model_len ({info.max_model_len}) to leave room for output"
                )
        except ValueError as e:
            raise invalid_argument(e, field) from None
        return GenerateRequest(
            request_id=request_id or f"{id_prefix}-{uuid.uuid4().hex}",
            sampling_params=params,
            prompt_token_ids=ids,
            priority=priority,
            arrival_time=arrival_time,
        )

    def admit(self) -> Slot:
        if self.is_draining:
            raise RequestError(ErrorKind.UNAVAILABLE, "the server is shutting down")
        try:
            return self.admission.acquire()
        except AdmissionRejected as e:
            raise RequestError(ErrorKind.BUSY, str(e), retry_after_s=e.retry_after_s) from None

    def deadline(self, timeout_s: float | None) -> float | None:
        """The event-loop time by which a request must finish (None: no deadline)."""
        if timeout_s is None:
            return None
        return asyncio.get_running_loop().time() + timeout_s

    async def stream(
        self, request: GenerateRequest, deadline: float | None
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the backend's outputs until the finished one.

        Raises RequestError: TIMEOUT at the deadline, INVALID if the backend refuses the
        request, INTERNAL if the engine failed it, UNAVAILABLE when the backend cannot serve
        it or the server drains past its grace. Leaving early aborts the request.
        """
        loop = asyncio.get_running_loop()
        outputs = self.backend.generate(request)
        record = self.metrics.record(request)
        try:
            while True:
                until = min(
                    (t for t in (deadline, self._drain_deadline) if t is not None), default=None
                )
                remaining = None if until is None else until - loop.time()
                try:
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(remaining) as wait:
                        self._waits.add(wait)
                        try:
                            out = await anext(outputs)
                        finally:
                            self._waits.discard(wait)
                except StopAsyncIteration:
                    raise RequestError(ErrorKind.INTERNAL, "the stream ended early") from None
                except TimeoutError:
                    if self._drain_deadline is not None and loop.time() >= self._drain_deadline:
                        raise RequestError(
                            ErrorKind.UNAVAILABLE,
                            "the server is shutting down: the request did not finish within "
                            f"the shutdown grace ({self._grace_s:g}s)",
                        ) from None
                    raise RequestError(
                        ErrorKind.TIMEOUT, "deadline exceeded: the request was aborted"
                    ) from None
                except ValueError as e:
                    raise invalid_argument(e) from None
                except RequestError:
                    raise
                except Exception as e:  # a bug behind the backend: fail it loudly, not silently
                    logger.exception("request %s failed", request.request_id)
                    raise RequestError(
                        ErrorKind.INTERNAL, f"the request failed: {type(e).__name__}: {e}"
                    ) from None
                if out.finish_reason == "error":
                    raise RequestError(ErrorKind.INTERNAL, "the engine failed this request")
                if out.finish_reason == "abort":
                    raise RequestError(ErrorKind.UNAVAILABLE, "the request was aborted")
                record.output(out)
                yield out
                if out.finished:
                    return
        except BaseException as e:
            record.fail(e)
            raise
        finally:
            record.close()
            await outputs.aclose()  # aborts the request unless it finished
