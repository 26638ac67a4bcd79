"""Load models: a closed loop (a fixed number of requests in flight) and an open loop
(Poisson arrivals at a rate, independent of how fast the server answers)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdserve.bench.arrivals import poisson_arrival_times
from pdserve.bench.client import BenchClient
from pdserve.bench.records import RequestRecord
from pdserve.bench.workload import BenchRequest

CLOSED, OPEN = "closed", "open"


@dataclass(frozen=True)
class LoadPoint:
    """``closed``: ``value`` requests in flight (an integer). ``open``: ``value`` requests/s
    (inf = all at once), at most ``max_concurrency`` in flight when set (the rest wait)."""

    kind: str
    value: float
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in (CLOSED, OPEN):
            raise ValueError(f"load kind must be closed or open, got {self.kind!r}")
        if self.value <= 0 or (self.kind == CLOSED and self.value != int(self.value)):
            raise ValueError(f"bad {self.kind} load {self.value}")

    @property
    def label(self) -> str:
        if self.kind == CLOSED:
            return f"concurrency {int(self.value)}"
        return "rate inf" if math.isinf(self.value) else f"rate {self.value:g}/s"


@dataclass
class PointResult:
    load: LoadPoint
    records: list[RequestRecord]
    duration_s: float  # first send to last completion


OnDone = Callable[[RequestRecord], None]


async def run_point(
    client: BenchClient,
    requests: Sequence[BenchRequest],
    load: LoadPoint,
    *,
    seed: int = 0,
    duration_s: float | None = None,
    on_done: OnDone | None = None,
) -> PointResult:
    """Drive ``requests`` under ``load``. With ``duration_s``, no request starts after that many
    seconds (those in flight finish); unsent requests get no record."""
    done = on_done or (lambda _r: None)
    t0 = time.perf_counter()
    deadline = None if duration_s is None else t0 + duration_s
    if load.kind == CLOSED:
        records = await _closed(client, requests, int(load.value), t0, deadline, done)
    else:
        records = await _open(client, requests, load, seed, t0, deadline, done)
    records.sort(key=lambda r: r.index)
    return PointResult(load, records, time.perf_counter() - t0)


async def send_and_record(
    client: BenchClient,
    request: BenchRequest,
    t0: float,
    records: list[RequestRecord],
    done: OnDone,
) -> None:
    """Send one request, keep its record and report it (every load model sends this way)."""
    record = await client.send(request, t0)
    records.append(record)
    done(record)


async def _closed(
    client: BenchClient,
    requests: Sequence[BenchRequest],
    concurrency: int,
    t0: float,
    deadline: float | None,
    done: OnDone,
) -> list[RequestRecord]:
    queue = iter(requests)
    records: list[RequestRecord] = []

    async def worker() -> None:
        for req in queue:  # one shared iterator: each request is taken by exactly one worker
            if deadline is not None and time.perf_counter() >= deadline:
                return
            await send_and_record(client, req, t0, records, done)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def _open(
    client: BenchClient,
    requests: Sequence[BenchRequest],
    load: LoadPoint,
    seed: int,
    t0: float,
    deadline: float | None,
    done: OnDone,
) -> list[RequestRecord]:
    times = poisson_arrival_times(load.value, len(requests), seed)
    limit = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    records: list[RequestRecord] = []

    async def one(req: BenchRequest) -> None:
        if limit is None:
            await send_and_record(client, req, t0, records, done)
        else:
            async with limit:
                await send_and_record(client, req, t0, records, done)

    tasks = []
    for req, at in zip(requests, times, strict=True):
        send_at = t0 + at
        if deadline is not None and send_at >= deadline:
            break
        delay = send_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(req)))
    await asyncio.gather(*tasks)
    return records
