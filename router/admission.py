"""Admission control: a bounded number of requests in flight through the router.

A request holds a slot from admission until its last token (or its error) is sent. Over the
limit a request is refused at once with a retry hint, never parked: a client that gets
RESOURCE_EXHAUSTED / HTTP 429 retries later or elsewhere, and the requests already admitted
keep their latency. All calls happen on the router's event loop, so a plain counter suffices.
"""

from __future__ import annotations

from types import TracebackType


class AdmissionRejected(Exception):
    """The router already has ``limit`` requests in flight."""

    def __init__(self, limit: int, retry_after_s: float) -> None:
        super().__init__(f"server busy: {limit} requests in flight; retry after {retry_after_s}s")
        self.limit = limit
        self.retry_after_s = retry_after_s


class Slot:
    """One admitted request's place. ``release()`` is idempotent; also a context manager."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.num_inflight -= 1
            self._admission = None

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class Admission:
    def __init__(self, max_inflight: int, retry_after_s: float = 1.0) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_inflight}")
        self.max_inflight = max_inflight
        self.retry_after_s = retry_after_s
        self.num_inflight = 0
        self.num_rejected = 0

    def acquire(self) -> Slot:
        """Take a slot for one request; raises AdmissionRejected when none is free."""
        if self.num_inflight >= self.max_inflight:
            self.num_rejected += 1
            raise AdmissionRejected(self.max_inflight, self.retry_after_s)
        self.num_inflight += 1
        return Slot(self)
