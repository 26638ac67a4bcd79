"""The prefill worker's KV connector: after every step the scheduler lists each exporting
request's newly completed prompt blocks; this connector pushes them to the decode worker's
reservation at once (the transfer overlaps the next chunk's compute), sends the first token
with the last blocks, and tells the scheduler when the blocks may be reused.

    engine thread                         the service's event loop: one job per request
    ─────────────                         ─────────────────────────────────────────────
    save_kv(saves) ──call_soon_threadsafe──▶ push(blocks)  ... finish(last blocks, token)
    request_finished ─▶ True (delay free)    renew decode's lease while the prompt waits,
                                            as long as the engine keeps stepping
    get_finished() ◀── wake() ◀── freeable   ended (finished, failed, cancelled) and no push
                                            reads the blocks any more

Ownership: a request's blocks are freed only when both the scheduler has finished the request
and its job has ended; whichever comes second frees them. A request the engine drops (aborted,
failed) before its prompt is done cancels its job at once.

Leases: decode releases a reservation nobody writes to or renews for one lease, and a prompt
may wait in this worker's queue far longer than that; so a job renews every third of a lease
while it waits, but only while the engine makes progress (``watch_engine``): a hung engine
stops renewing, the job fails, and decode reclaims its blocks within a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.kv_connector.base import KVConnectorOutput, KVSave
from engine.request import Request, RequestStatus
from kv_transfer.errors import KVTransferError
from kv_transfer.sender import OutgoingTransfer

logger = logging.getLogger(__name__)

_DROPPED = (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR)


class EngineStalledError(RuntimeError):
    """The engine made no step for a whole lease while a job waited: stop keeping decode's
    blocks for it."""


@dataclass
class _Job:
    transfer: OutgoingTransfer
    done: asyncio.Future[None]  # the service awaits it: decode holds every block
    saves: asyncio.Queue[KVSave | None] = field(default_factory=asyncio.Queue)  # None: cancel
    task: asyncio.Task[None] | None = None


class PrefillConnector:
    """``engine.kv_connector.base.KVConnector`` for a prefill worker."""

    def __init__(self, renew_every_s: float | None = None) -> None:
        """``renew_every_s``: renew decode's lease this often while a job waits for its
        prompt's first blocks (default: a third of the ticket's lease)."""
        self._renew_every_s = renew_every_s
        self._num_steps: Callable[[], int] | None = None
        self._lock = threading.Lock()
        self._wake: Callable[[], None] = lambda: None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: dict[str, _Job] = {}  # event loop only
        self._finished: set[str] = set()  # the scheduler finished it; the job has not ended
        self._ended: set[str] = set()  # the job ended; the scheduler has not finished it
        self._freeable: set[str] = set()

    # ------------------------------------------------------------------ the service's side
    def start_job(self, request_id: str, transfer: OutgoingTransfer) -> asyncio.Future[None]:
        """Serve ``request_id``'s export over ``transfer`` (opened by the service). Returns
        a future that ends when decode holds every block (or with the transfer's error).
        Call on the event loop, before adding the request to the engine."""
        self._loop = asyncio.get_running_loop()
        job = _Job(transfer, self._loop.create_future())
        # The service may stop awaiting (its call was cancelled) before the job ends with an
        # error: mark the error seen so asyncio does not log it as never retrieved.
        job.done.add_done_callback(_observe)
        job.task = asyncio.create_task(self._run(request_id, job), name=f"export-{request_id}")
        self._jobs[request_id] = job
        return job.done

    def cancel_job(self, request_id: str) -> None:
        """Stop the export (the client went away); idempotent. The blocks are freed once no
        push reads them and the engine has dropped the request."""
        job = self._jobs.get(request_id)
        if job is not None:
            # A sentinel, not task.cancel(): a task cancelled before it first runs would skip
            # its clean-up (the abort that tells decode, and freeing the blocks).
            job.saves.put_nowait(None)

    def watch_engine(self, num_steps: Callable[[], int]) -> None:
        """Renew leases only while ``num_steps()`` (the engine's step count) keeps moving."""
        self._num_steps = num_steps

    # ------------------------------------------------------------------ scheduler side
    def set_wakeup(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if request.is_import:
            raise ValueError("a prefill worker imports no KV")
        return 0, False

    def update_state_after_alloc(
        self, request: Request, block_ids: Sequence[int], num_external_tokens: int
    ) -> None:
        pass

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> bool:
        if not request.is_export:
            return False
        rid = request.request_id
        if request.status in _DROPPED:
            # The engine dropped the prompt (aborted, failed): its job would otherwise wait
            # for blocks that never come, renewing decode's lease, until a renewal failed.
            self._on_loop(self.cancel_job, rid)
        with self._lock:
            if rid in self._ended:
                self._ended.discard(rid)
                return False  # nothing reads the blocks any more
            self._finished.add(rid)
            return True

    def save_kv(self, saves: Sequence[KVSave]) -> None:
        self._on_loop(self._dispatch, list(saves))

    def _on_loop(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` on the jobs' event loop (from the engine thread)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing: jobs are cancelled
                loop.call_soon_threadsafe(fn, arg)

    def get_finished(self) -> KVConnectorOutput:
        with self._lock:
            freeable, self._freeable = frozenset(self._freeable), set()
        return KVConnectorOutput(freeable=freeable)

    def has_pending_output(self) -> bool:
        with self._lock:
            return bool(self._freeable)

    # ------------------------------------------------------------------ jobs (event loop)
    def _dispatch(self, saves: list[KVSave]) -> None:
        for save in saves:
            job = self._jobs.get(save.request_id)
            if job is not None:
                job.saves.put_nowait(save)

    async def _run(self, request_id: str, job: _Job) -> None:
        transfer = job.transfer
        ticket = transfer.ticket
        renew_s = self._renew_every_s or max(0.05, ticket.lease_s / 3)
        loop = asyncio.get_running_loop()
        steps, progressed = self._steps(), loop.time()
        finished = False
        try:
            while True:
                try:
                    save = await asyncio.wait_for(job.saves.get(), renew_s)
                except TimeoutError:
                    if (now_steps := self._steps()) != steps:
                        steps, progressed = now_steps, loop.time()
                    elif self._num_steps and loop.time() - progressed >= ticket.lease_s:
                        raise EngineStalledError(
                            f"the prefill engine made no progress for {ticket.lease_s:g}s"
                        ) from None
                    await transfer.renew()  # the prompt still waits: keep decode's blocks
                    continue
                if save is None:
                    job.done.cancel()
                    return
                todo = [
                    (i, b)
                    for i, b in zip(save.block_indices, save.block_ids, strict=True)
                    if i not in ticket.cached_blocks
                ]
                indices = [i for i, _ in todo]
                src = [b for _, b in todo]
                if not save.is_last:
                    if todo:
                        transfer.push(indices, src)
                    continue
                assert save.first_token_id is not None
                await transfer.finish(
                    save.first_token_id, save.first_token_logprob or 0.0, indices, src
                )
                finished = True
                if not job.done.done():
                    job.done.set_result(None)
                return
        except (KVTransferError, ValueError, EngineStalledError) as e:
            if not job.done.done():
                job.done.set_exception(e)
        except asyncio.CancelledError:  # the event loop is shutting down
            if not job.done.done():
                job.done.cancel()
            raise
        except Exception as e:  # a defect: still fail the request and end the job
            logger.exception("export of %s failed", request_id)
            if not job.done.done():
                job.done.set_exception(e)
        finally:
            if finished:
                self._end_job(request_id, job)
            else:
                # The job ends (its blocks may be freed) once no push of this transfer reads
                # them any more, whatever the abort raised and even if this task is
                # cancelled meanwhile.
                aborting = asyncio.ensure_future(transfer.abort("prefill did not finish"))
                aborting.add_done_callback(lambda f: self._aborted(request_id, job, f))
                await asyncio.wait([aborting])  # raises nothing but this task's cancellation

    def _steps(self) -> int:
        return self._num_steps() if self._num_steps is not None else 0

    def _aborted(self, request_id: str, job: _Job, aborting: asyncio.Future[None]) -> None:
        if not aborting.cancelled() and (e := aborting.exception()) is not None:
            logger.error("abort of %s's transfer failed: %r", request_id, e)
        self._end_job(request_id, job)

    def _end_job(self, request_id: str, job: _Job) -> None:
        if self._jobs.get(request_id) is job:
            del self._jobs[request_id]
        self._job_ended(request_id)

    def _job_ended(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._finished:
                self._finished.discard(request_id)
                self._freeable.add(request_id)
                wake = True
            else:
                self._ended.add(request_id)
                wake = False
        if wake:
            self._wake()


def _observe(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
