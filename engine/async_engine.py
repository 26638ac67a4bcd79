"""An asyncio face for ``LLMEngine``: one background thread owns the engine, coroutines stream.

```
 asyncio loop(s)                         engine thread (owns the LLMEngine)
 ───────────────                         ──────────────────────────────────
 generate() ─┐ command deque + Condition ┌─▶ add_request / abort_request / call
 abort()    ─┼──────────────────────────▶┤
 call()     ─┘                           └─▶ step() while there is work; sleeps when idle
 per-request asyncio.Queue ◀── loop.call_soon_threadsafe(one batch per loop per step)
```

The engine is never touched outside its thread. Commands run in the order they were
submitted, so an abort issued after a generate always finds (or outlives) its request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.engine_stats import EngineStats
from engine.kv_connector.params import KVTransferParams
from engine.llm_engine import LLMEngine
from engine.metrics import EngineMetrics
from engine.outputs import RequestOutput
from engine.resume import ResumeState
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EngineShutdownError(RuntimeError):
    """The engine thread has stopped; no more requests are accepted."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput]


@dataclass
class _Add:
    """Queue a request (``LLMEngine.add_request`` arguments) and open its stream."""

    request_id: str
    kwargs: dict[str, Any]
    stream: _Stream
    accepted: asyncio.Future[None]


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[LLMEngine], Any]
    loop: asyncio.AbstractEventLoop
    result: asyncio.Future[Any]


_Command = _Add | _Abort | _Call


def error_output(request_id: str, reason: str = "error") -> RequestOutput:
    """A final output for a request the engine could not finish normally."""
    return RequestOutput(
        request_id=request_id,
        prompt_token_ids=[],
        token_ids=[],
        text="",
        new_token_ids=[],
        new_text="",
        finished=True,
        finish_reason=reason,
    )


class AsyncEngine:
    """Runs ``engine`` on a dedicated thread (started here) and streams outputs to coroutines.

    Thread-safe: ``generate``/``abort``/``call`` may be used from any event loop or thread.
    """

    def __init__(
        self, engine: LLMEngine, on_step: Callable[[LLMEngine], None] | None = None
    ) -> None:
        """``on_step(engine)`` runs on the engine thread after every step and after every batch
        of commands (a worker moves the engine's prefix-cache events to the control plane
        there); it must be quick."""
        self.engine = engine
        engine.set_wakeup(self._wake)
        self._on_step = on_step
        self._cond = threading.Condition()
        self._commands: deque[_Command] = deque()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._stopping = False
        self.stats = self._snapshot()
        self._thread = threading.Thread(target=self._run, name="pdserve-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public
    @property
    def metrics(self) -> EngineMetrics:
        """The engine's latency and step histograms (thread-safe to read). Counters and
        queue sizes are in ``stats``."""
        return self.engine.metrics

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    async def generate(
        self,
        request_id: str,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        priority: int = 0,
        kv_transfer: KVTransferParams | None = None,
        resume: ResumeState | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Queue a request and yield its per-step outputs; the last one has ``finished``.

        Raises ValueError (from ``add_request``) before yielding anything if the request is
        invalid. If the consumer stops early (cancellation, ``aclose()``, an exception), the
        request is aborted and its blocks freed; wrap partial consumption in
        ``contextlib.aclosing`` so that happens promptly. ``kv_transfer``: the prompt's KV
        leaves or enters through the engine's KV connector (prefill and decode workers).
        ``resume``: the prompt ids end with an earlier run's outputs (engine.resume).
        """
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, asyncio.Queue())
        accepted: asyncio.Future[None] = loop.create_future()
        kwargs: dict[str, Any] = dict(
            prompt=prompt,
            sampling_params=sampling_params,
            prompt_token_ids=prompt_token_ids,
            priority=priority,
            kv_transfer=kv_transfer,
            resume=resume,
        )
        self._submit(_Add(request_id, kwargs, stream, accepted))
        try:
            await accepted
        except ValueError:
            raise  # rejected by add_request: nothing was queued under this id
        except BaseException:
            self.abort(request_id)  # cancelled while the add was in flight
            raise
        finished = False
        try:
            while not finished:
                out = await stream.queue.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread. Idempotent; unknown ids are ignored."""
        with self._cond:
            if self._stopping:
                return
            self._commands.append(_Abort(request_id))
            self._cond.notify()

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between steps and return its result."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        self._submit(_Call(fn, loop, result))
        return await result

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the thread; every open stream ends with finish_reason "abort". Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("engine thread did not stop within %.1fs", timeout_s)

    # ----------------------------------------------------------------- private
    def _submit(self, command: _Command) -> None:
        with self._cond:
            if self._stopping:
                raise EngineShutdownError("the engine is shut down")
            self._commands.append(command)
            self._cond.notify()

    def _run(self) -> None:
        engine = self.engine
        busy = False
        while True:
            with self._cond:
                while not self._commands and not self._stopping and not self._has_work():
                    self._cond.wait()
                commands = list(self._commands)
                self._commands.clear()
                stopping = self._stopping
            for command in commands:
                self._execute(command, stopping)
            if stopping:
                self._close_all()
                break
            if commands:  # they may have changed the cache (an abort frees blocks)
                self._run_hook()
            if self._has_work():
                busy = True
                try:
                    outputs = engine.step()
                except Exception:
                    logger.exception("engine step failed; failing its requests")
                    self._fail_all("error")
                    self.stats = self._snapshot()
                else:
                    self.stats = self._snapshot()  # before delivery: a reader sees this step
                    self._run_hook()  # before delivery: hook effects come first
                    self._deliver(outputs)
            else:
                if busy:  # just went idle: the cheap moment to check the pool's invariants
                    busy = False
                    engine.check_invariants()
                self.stats = self._snapshot()

    def _has_work(self) -> bool:
        return self.engine.has_work()

    def _wake(self) -> None:
        """The KV connector has news (any thread): step even if nothing else is pending."""
        with self._cond:
            self._cond.notify()

    def _run_hook(self) -> None:
        if self._on_step is not None:
            try:
                self._on_step(self.engine)
            except Exception:
                logger.exception("on_step hook failed")

    def _execute(self, command: _Command, stopping: bool) -> None:
        if isinstance(command, _Add):
            if stopping:
                _resolve(
                    command.stream.loop,
                    command.accepted,
                    None,
                    EngineShutdownError("the engine is shut down"),
                )
                return
            try:
                self.engine.add_request(command.request_id, **command.kwargs)
            except Exception as e:
                _resolve(command.stream.loop, command.accepted, None, e)
                return
            self._streams[command.request_id] = command.stream
            _resolve(command.stream.loop, command.accepted, None, None)
        elif isinstance(command, _Abort):
            self.engine.abort_request(command.request_id)
            self._streams.pop(command.request_id, None)
        else:
            try:
                value = command.fn(self.engine)
            except Exception as e:
                _resolve(command.loop, command.result, None, e)
            else:
                _resolve(command.loop, command.result, value, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, RequestOutput]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            batches.setdefault(stream.loop, []).append((stream, out))
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that loop is closed: nobody is listening any more
                for _, out in batch:
                    self.engine.abort_request(out.request_id)

    def _fail_all(self, reason: str) -> None:
        """End every open stream with ``reason`` and free every request's blocks."""
        streams = self._streams
        self._streams = {}
        for request_id in list(streams):
            self.engine.abort_request(request_id)
        if self.engine.has_unfinished_requests():
            logger.error("requests left in the engine after failing all streams")
        self._deliver_final(streams, reason)

    def _deliver_final(self, streams: dict[str, _Stream], reason: str) -> None:
        for request_id, stream in streams.items():
            try:
                stream.loop.call_soon_threadsafe(
                    _put_all, [(stream, error_output(request_id, reason))]
                )
            except RuntimeError:
                pass

    def _close_all(self) -> None:
        self._fail_all("abort")
        self.stats = self._snapshot()
        with self._cond:
            leftover = list(self._commands)
            self._commands.clear()
        for command in leftover:
            self._execute(command, stopping=True)

    def _snapshot(self) -> EngineStats:
        return self.engine.stats()


def _put_all(batch: list[tuple[_Stream, RequestOutput]]) -> None:
    for stream, out in batch:
        stream.queue.put_nowait(out)


def _resolve(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    value: Any,
    err: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():  # the awaiting coroutine was cancelled
            return
        if err is not None:
            future.set_exception(err)
        else:
            future.set_result(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass
