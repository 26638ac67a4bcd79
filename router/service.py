"""The protocol-independent request flow both front ends share.

```
 gRPC / HTTP handler
   check_model ─▶ prepare (params, tokenize, length) ─▶ admit (slot) ─▶ stream (deadline)
        │               │                                   │                │
     NOT_FOUND       INVALID                              BUSY     TIMEOUT / INTERNAL
```

Every refusal is a ``RequestError``; a stream that ends early for any reason (deadline,
cancellation, disconnect, an error) aborts the backend request, freeing its blocks.
"""

from __future__ import annotations

import asyncio
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


class Router:
    def __init__(
        self, backend: Backend, admission: Admission, metrics: RouterMetrics | None = None
    ) -> None:
        self.backend = backend
        self.admission = admission
        self.model_name = backend.model_info().model
        self.metrics = metrics or RouterMetrics("router", self.model_name)
        self.metrics.watch(admission, backend)

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
        request, INTERNAL if the engine failed it. Leaving early aborts the request.
        """
        loop = asyncio.get_running_loop()
        outputs = self.backend.generate(request)
        record = self.metrics.record(request)
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                try:
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(remaining):
                        out = await anext(outputs)
                except StopAsyncIteration:
                    raise RequestError(ErrorKind.INTERNAL, "the stream ended early") from None
                except TimeoutError:
                    raise RequestError(
                        ErrorKind.TIMEOUT, "deadline exceeded: the request was aborted"
                    ) from None
                except ValueError as e:
                    raise invalid_argument(e) from None
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
