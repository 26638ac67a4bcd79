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
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from router.admission import Admission, AdmissionRejected, Slot
from router.backend import Backend, GenerateRequest
from router.errors import ErrorKind, RequestError, invalid_argument, unknown_model
from router.metrics import RouterMetrics
from router.prompts import Prompts
from router.request_ids import InFlightIds
from router.request_limits import RequestLimits
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions

logger = logging.getLogger(__name__)


class Router:
    def __init__(
        self,
        backend: Backend,
        admission: Admission,
        metrics: RouterMetrics | None = None,
        limits: RequestLimits | None = None,
    ) -> None:
        self.backend = backend
        self.admission = admission
        info = backend.model_info()
        self.model_name = info.model
        self.metrics = metrics or RouterMetrics("router", self.model_name)
        self.metrics.watch(admission, backend)
        self.prompts = Prompts(backend, limits)  # prompts to ids, on the tokenizer thread
        self.limits = self.prompts.limits
        self.served_names = info.served_names or (info.model,)
        # A client may name the model by any served name or by the path it was loaded from.
        self._accepted_names = set(self.served_names)
        if info.model_path:
            self._accepted_names |= {info.model_path, str(Path(info.model_path).resolve())}
        self._drain_deadline: float | None = None  # event-loop time; set while draining
        self._grace_s = 0.0
        self._waits: set[asyncio.Timeout] = set()  # every stream's current wait for output
        self._ids = InFlightIds()  # the request ids with a stream open (one each)

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
        if requested and requested not in self._accepted_names:
            raise unknown_model(requested, self.model_name)

    def check_fanout(self, num_prompts: int, n: int, best_of: int | None) -> None:
        """Refuse more sequences in one request than the limits allow."""
        lim = self.limits
        if num_prompts > lim.max_batch_prompts:
            raise RequestError(
                ErrorKind.INVALID,
                f"prompt: at most {lim.max_batch_prompts} prompts per request, got {num_prompts}",
                "prompt",
            )
        total = num_prompts * (best_of or n)
        if total > lim.max_batch_prompts:
            param = "best_of" if best_of else "n"
            raise RequestError(
                ErrorKind.INVALID,
                f"{param}: at most {lim.max_batch_prompts} sequences per request "
                f"(prompts x {param}), got {total}",
                param,
            )

    @staticmethod
    def new_request_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    async def detokenize(self, token_ids: list[int], field: str = "tokens") -> str:
        """Text of prompt token ids (checked against the vocabulary, refusals naming
        ``field``), on the tokenizer thread."""
        vocab = self.backend.model_info().vocab_size
        for t in token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise RequestError(
                    ErrorKind.INVALID, f"{field}: ids must be in [0, {vocab}), got {t!r}", field
                )
        return await self.prompts.run(lambda: self.backend.detokenize(token_ids))

    @staticmethod
    def with_logprobs(request: GenerateRequest) -> GenerateRequest:
        """The request asking for its sampled tokens' logprobs (best_of ranks by them)."""
        params = dataclasses.replace(request.sampling_params, logprobs=0)
        return dataclasses.replace(request, sampling_params=params)

    async def prepare(
        self,
        params: SamplingParams,
        prompt: str | Sequence[int] | None = None,
        messages: list[dict[str, Any]] | None = None,
        priority: int = 0,
        request_id: str | None = None,
        id_prefix: str = "req",
        tools: list[dict[str, Any]] | None = None,
        id_field: str = "request_id",
        chat_options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> GenerateRequest:
        """Tokenize the prompt (text, token ids or chat messages) and check it fits the model.

        Raises RequestError(INVALID) naming the field. Tokenizing here (not in the engine)
        lets the router route by prompt blocks and refuse an oversize prompt before any
        response is started. Text is length-checked first and tokenized on the tokenizer
        thread.
        """
        arrival_time = time.monotonic()
        field = "messages" if messages is not None else "prompt"
        info = self.backend.model_info()
        self.check_params(params)
        ids = await self.prompts.ids(prompt, messages, tools, chat_options)
        if params.max_tokens is not None and len(ids) + params.max_tokens > info.max_model_len:
            raise RequestError(
                ErrorKind.INVALID,
                f"max_tokens is {params.max_tokens}, but the {field} is {len(ids)} tokens and "
                f"the model's max_model_len is {info.max_model_len}: at most "
                f"{info.max_model_len - len(ids)} tokens can be generated",
                "max_tokens",
            )
        return GenerateRequest(
            request_id=request_id or f"{id_prefix}-{uuid.uuid4().hex}",
            sampling_params=params,
            prompt_token_ids=ids,
            priority=priority,
            arrival_time=arrival_time,
            id_field=id_field,
        )

    def check_params(self, params: SamplingParams) -> None:
        """The bounds sampling parameters must keep beyond their own validation: the
        vocabulary and the router's request limits. Raises RequestError(INVALID)."""
        lim = self.limits
        vocab = self.backend.model_info().vocab_size
        if params.structured is not None:
            try:
                params.structured.validate()
            except ValueError as e:
                raise invalid_argument(e) from None
        if len(params.logit_bias) > lim.max_logit_bias:
            raise RequestError(
                ErrorKind.INVALID,
                f"logit_bias: at most {lim.max_logit_bias} entries",
                "logit_bias",
            )
        for t, _ in params.logit_bias:  # type: ignore[misc]
            if t >= vocab:
                raise RequestError(
                    ErrorKind.INVALID,
                    f"logit_bias: token ids must be in [0, {vocab}), got {t}",
                    "logit_bias",
                )

        def bad(param: str, message: str) -> RequestError:
            return RequestError(ErrorKind.INVALID, f"{param}: {message}", param)

        if len(params.stop) > lim.max_stop_strings:
            raise bad(
                "stop", f"at most {lim.max_stop_strings} stop strings, got {len(params.stop)}"
            )
        for s in params.stop:
            if len(s) > lim.max_stop_chars:
                raise bad("stop", f"a stop string may be at most {lim.max_stop_chars} characters")
        if len(params.stop_token_ids) > lim.max_stop_token_ids:
            raise bad("stop_token_ids", f"at most {lim.max_stop_token_ids} ids")
        for t in params.stop_token_ids:
            if t >= vocab:
                raise bad("stop_token_ids", f"token ids must be in [0, {vocab}), got {t}")

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

        Raises RequestError: CONFLICT (before anything starts) while another request with
        the same id streams (a stream already closing is waited for: request_ids.py),
        TIMEOUT at the deadline, INVALID if the backend refuses the request, INTERNAL if the
        engine failed it, UNAVAILABLE when the backend cannot serve it or the server drains
        past its grace. Leaving early aborts the request; the id is free again once the
        backend let go of it (its worker calls ended).
        """
        rid = request.request_id
        try:
            hold = await self._ids.acquire(rid, deadline, request.id_field)
        except RequestError as conflict:
            self.metrics.rejected(conflict)
            raise
        try:
            async with contextlib.aclosing(self._stream(request, deadline)) as outputs:
                try:
                    async for out in outputs:
                        yield out
                finally:
                    hold.closing = True  # a retry with this id may wait for the clean-up
        finally:
            self._ids.release(rid, hold)

    async def _stream(
        self, request: GenerateRequest, deadline: float | None
    ) -> AsyncGenerator[RequestOutput, None]:
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
