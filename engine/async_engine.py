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
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after every step and command batch."""

    num_blocks: int
    num_free_blocks: int
    num_host_blocks: int
    num_free_host_blocks: int
    num_running: int
    num_waiting: int
    num_swapped: int
    num_steps: int

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks


class EngineShutdownError(RuntimeError):
    """The engine thread has stopped; no more requests are accepted."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput]


@dataclass
class _Attach:
    """Open a stream for a request that ``start`` puts into the engine (e.g. a request whose
    KV arrived from a remote prefill); ``start``'s outputs are delivered first."""

    request_id: str
    start: Callable[[LLMEngine], list[RequestOutput]]
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


_Command = _Attach | _Abort | _Call


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
        of commands (the prefill role drains its KV-export progress there; the decode role
        hands freed blocks to requests waiting for them); it must be quick and must not
        raise."""
        self.engine = engine
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
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    async def generate(
        self,
        request_id: str,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Queue a request and yield its per-step outputs; the last one has ``finished``.

        Raises ValueError (from ``add_request``) before yielding anything if the request is
        invalid. If the consumer stops early (cancellation, ``aclose()``, an exception), the
        request is aborted and its blocks freed; wrap partial consumption in
        ``contextlib.aclosing`` so that happens promptly.
        """

        def start(engine: LLMEngine) -> list[RequestOutput]:
            engine.add_request(
                request_id, prompt, sampling_params, prompt_token_ids, priority=priority
            )
            return []

        # aclosing: an early exit here closes the inner stream at once, which aborts.
        async with contextlib.aclosing(self.attach(request_id, start)) as stream:
            async for out in stream:
                yield out

    async def attach(
        self, request_id: str, start: Callable[[LLMEngine], list[RequestOutput]]
    ) -> AsyncGenerator[RequestOutput, None]:
        """Run ``start(engine)`` on the engine thread (it admits ``request_id`` some other way
        than ``add_request``) and stream the request's outputs, ``start``'s own first. Errors
        from ``start`` (ValueError for bad input) are raised before anything is yielded. Early
        exit aborts the request."""
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, asyncio.Queue())
        accepted: asyncio.Future[None] = loop.create_future()
        self._submit(_Attach(request_id, start, stream, accepted))
        try:
            await accepted
        except ValueError:
            raise  # rejected by start (e.g. add_request): nothing was queued under this id
        except BaseException:
            self.abort(request_id)  # cancelled while start was in flight
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
            if commands:  # they may have freed blocks (an abort) or changed what waits
                self._run_hook()
            if self._has_work():
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
                self.stats = self._snapshot()

    def _has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def _run_hook(self) -> None:
        if self._on_step is not None:
            try:
                self._on_step(self.engine)
            except Exception:
                logger.exception("on_step hook failed")

    def _execute(self, command: _Command, stopping: bool) -> None:
        if isinstance(command, _Attach):
            if stopping:
                _resolve(
                    command.stream.loop,
                    command.accepted,
                    None,
                    EngineShutdownError("the engine is shut down"),
                )
                return
            try:
                first = command.start(self.engine)
            except Exception as e:
                _resolve(command.stream.loop, command.accepted, None, e)
                return
            self._streams[command.request_id] = command.stream
            _resolve(command.stream.loop, command.accepted, None, None)
            self._deliver(first)
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
        bm = self.engine.block_manager
        sched = self.engine.scheduler
        return EngineStats(
            num_blocks=bm.num_blocks,
            num_free_blocks=bm.num_free_blocks,
            num_host_blocks=bm.num_host_blocks,
            num_free_host_blocks=bm.num_free_host_blocks,
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            num_swapped=len(sched.swapped),
            num_steps=self.engine.num_steps,
        )


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
