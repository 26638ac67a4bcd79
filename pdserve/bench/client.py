"""The one interface every load model drives: send a request, get back its record."""

from __future__ import annotations

import time
from typing import Protocol

from pdserve.bench.records import RequestRecord
from pdserve.bench.workload import BenchRequest


class BenchClient(Protocol):
    """A protocol client (OpenAI HTTP, gRPC). ``send`` never raises for a failed request: the
    failure is in the record (``status`` failed, ``error``); it only measures, never retries."""

    async def model_name(self) -> str:
        """The model to name in requests: the configured one, else the server's first."""
        ...

    async def send(self, request: BenchRequest, t0: float) -> RequestRecord:
        """Send ``request`` now, stream it to the end (or to its cancel point) and return its
        record; ``t0`` (``time.perf_counter()``) is the load point's start."""
        ...

    async def aclose(self) -> None: ...


class StreamTimer:
    """Stamps a streamed response into a record: the first content chunk sets TTFT, every
    later one adds its gap to ``itl_s``, ``finish`` sets the end-to-end time."""

    def __init__(self, record: RequestRecord, t0: float) -> None:
        self.record = record
        self.sent_at = time.perf_counter()
        record.start_s = self.sent_at - t0
        self._last: float | None = None

    def chunk(self) -> None:
        now = time.perf_counter()
        if self._last is None:
            self.record.ttft_s = now - self.sent_at
        else:
            self.record.itl_s.append(now - self._last)
        self._last = now
        self.record.num_chunks += 1

    def finish(self) -> None:
        self.record.e2e_s = time.perf_counter() - self.sent_at
        if self.record.ttft_s is None and self.record.num_output_tokens > 0:
            self.record.ttft_s = self.record.e2e_s  # tokens without text: only the end is seen
