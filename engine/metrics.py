"""Per-step and per-request engine statistics, plain Python: the services export them.

The engine thread records; a metrics scrape (another thread) reads ``snapshot()`` copies. No
Prometheus here: ``Histogram`` is a fixed-bucket cumulative histogram that an exporter turns
into a Prometheus histogram without re-bucketing.

What is measured, per engine (times from ``time.monotonic()``):

    arrival ──queue──▶ first scheduled ──prefill──▶ first token ── ... ──▶ finished
    (add_request)       (first step that           (the step that
                         computes a token of it)    sampled it)

Requests admitted from a remote prefill (decode role) have no local queue or prefill; they
count in neither histogram.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from engine.outputs import RequestOutput

# Seconds: 1 ms .. 60 s, dense where interactive SLOs live (TTFT 100 ms-2 s, ITL 10-200 ms).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip
# Tokens computed in one step: 1 (a lone decode) .. a full 8k budget.
STEP_TOKEN_BUCKETS: tuple[float, ...] = (
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
)  # fmt: skip


@dataclass(frozen=True)
class HistogramSnapshot:
    bounds: tuple[float, ...]  # upper bounds, ascending, +Inf implied after the last
    counts: tuple[int, ...]  # per bucket (not cumulative), len(bounds) + 1
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= bound) pairs, ending with (+inf, count)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class Histogram:
    """Thread-safe: ``observe`` from one thread, ``snapshot`` from any."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError("bucket bounds must be strictly increasing")
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)  # le semantics: value == bound goes in it
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            return HistogramSnapshot(self.bounds, tuple(self._counts), self._sum)


@dataclass(frozen=True)
class EngineMetricsSnapshot:
    step_seconds: HistogramSnapshot
    step_tokens: HistogramSnapshot  # tokens computed per step (prefill chunks + decodes)
    step_requests: HistogramSnapshot  # requests in a step's batch
    queue_seconds: HistogramSnapshot  # arrival -> first scheduled (local prefills only)
    prefill_seconds: HistogramSnapshot  # first scheduled -> first token (local prefills only)
    num_generation_tokens: int  # tokens this engine sampled (a remote prefill's first excluded)
    num_prompt_tokens_computed: int = 0  # prompt tokens run through the model (prefill compute)


class EngineMetrics:
    """Recorded by ``LLMEngine.step`` on the engine thread."""

    def __init__(self) -> None:
        self.step_seconds = Histogram(LATENCY_BUCKETS_S)
        self.step_tokens = Histogram(STEP_TOKEN_BUCKETS)
        self.step_requests = Histogram(STEP_TOKEN_BUCKETS)
        self.queue_seconds = Histogram(LATENCY_BUCKETS_S)
        self.prefill_seconds = Histogram(LATENCY_BUCKETS_S)
        self._num_generation_tokens = 0
        self._num_prompt_tokens_computed = 0

    def record_step(
        self,
        seconds: float,
        num_tokens: int,
        num_requests: int,
        outputs: Sequence[RequestOutput],
        num_prompt_tokens: int = 0,
    ) -> None:
        """One executed step and the outputs it produced; ``num_prompt_tokens`` of its
        tokens were prompt tokens (prefill compute)."""
        self._num_prompt_tokens_computed += num_prompt_tokens
        if num_requests == 0:
            return  # a swap-only or empty step: no batch to describe
        self.step_seconds.observe(seconds)
        self.step_tokens.observe(num_tokens)
        self.step_requests.observe(num_requests)
        for out in outputs:
            self._num_generation_tokens += len(out.new_token_ids)
            m = out.metrics
            # The first token ever (a recompute-preempted request re-emits nothing).
            if m is None or len(out.token_ids) != len(out.new_token_ids):
                continue
            if m.first_scheduled_time is None or m.first_token_time is None:
                continue
            self.queue_seconds.observe(max(0.0, m.first_scheduled_time - m.arrival_time))
            self.prefill_seconds.observe(max(0.0, m.first_token_time - m.first_scheduled_time))

    def snapshot(self) -> EngineMetricsSnapshot:
        return EngineMetricsSnapshot(
            step_seconds=self.step_seconds.snapshot(),
            step_tokens=self.step_tokens.snapshot(),
            step_requests=self.step_requests.snapshot(),
            queue_seconds=self.queue_seconds.snapshot(),
            prefill_seconds=self.prefill_seconds.snapshot(),
            num_generation_tokens=self._num_generation_tokens,
            num_prompt_tokens_computed=self._num_prompt_tokens_computed,
        )
