"""Background bursts: groups of (typically long-prompt) requests sent at a fixed interval while
a load point runs, so the foreground's latencies show what prefill bursts do to them.

This is the workload that separates disaggregated from colocated serving: a colocated engine
runs a burst's prefill chunks in the same steps as every streaming request's decode, so their
inter-token latency jumps; a disaggregated one prefills on other workers. The bursts' own
records are reported apart from the foreground's and never mix into its figures.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from pdserve.bench.client import BenchClient
from pdserve.bench.distributions import LengthDist
from pdserve.bench.load import OnDone, send_and_record
from pdserve.bench.records import RequestRecord
from pdserve.bench.workload import BenchRequest, WorkloadSpec, generate_requests

# Token ids of bursts never repeat those of the foreground or of each other (prefix caching
# would otherwise turn a burst's prefill into a cache hit). Replicas from here on are bursts'.
BURST_REPLICA_BASE = 1_000_000


@dataclass(frozen=True)
class BurstSpec:
    size: int  # requests per burst, sent at once
    interval_s: float  # from one burst to the next
    start_s: float  # the first burst, from the start of the load point
    prompt_len: LengthDist
    output_len: LengthDist

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a burst needs at least 1 request")
        if self.interval_s <= 0 or self.start_s < 0:
            raise ValueError("bursts need interval_s > 0 and start_s >= 0")


def burst_requests(
    spec: BurstSpec, workload: WorkloadSpec, point: int, burst: int
) -> list[BenchRequest]:
    """The requests of burst ``burst`` of load point ``point``: the foreground's seed and token
    range, the bursts' lengths, token ids of their own; indices count across bursts."""
    shape = WorkloadSpec(
        num_requests=spec.size,
        prompt_len=spec.prompt_len,
        output_len=spec.output_len,
        seed=workload.seed,
        token_id_low=workload.token_id_low,
        token_id_high=workload.token_id_high,
    )
    replica = BURST_REPLICA_BASE + point * 100_000 + burst
    return [
        replace(r, index=burst * spec.size + r.index) for r in generate_requests(shape, replica)
    ]


async def run_bursts(
    client: BenchClient,
    spec: BurstSpec,
    workload: WorkloadSpec,
    point: int,
    stop: asyncio.Event,
    on_done: OnDone | None = None,
) -> list[RequestRecord]:
    """Send a burst every ``interval_s`` (the first at ``start_s``) until ``stop`` is set, then
    wait for the bursts in flight; returns their records, ``start_s`` from this call's start."""
    done = on_done or (lambda _r: None)
    t0 = time.perf_counter()
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []

    burst = 0
    while True:
        delay = t0 + spec.start_s + burst * spec.interval_s - time.perf_counter()
        if delay > 0:
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
        if stop.is_set():
            break
        tasks += [
            asyncio.create_task(send_and_record(client, r, t0, records, done))
            for r in burst_requests(spec, workload, point, burst)
        ]
        burst += 1
    await asyncio.gather(*tasks)
    records.sort(key=lambda r: r.index)
    return records
