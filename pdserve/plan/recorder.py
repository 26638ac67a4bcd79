"""What the simulation measured, in ``pdserve bench``'s terms.

Two recorders, one ``Summary`` (``pdserve.bench.metrics``):

* ``FullRecorder`` keeps a ``RequestRecord`` per request with every token's gap, exactly as
  ``pdserve bench`` writes them, and summarizes with bench's own ``summarize``: the JSON
  report and the plots of ``pdserve bench`` apply unchanged. For runs of up to ~10^5
  requests.
* ``CompactRecorder`` keeps per-request numbers in arrays and inter-token gaps in a
  log-bucketed histogram (0.2% wide buckets), for hour-long runs of hundreds of workers;
  its ITL percentiles are those of the histogram (within a bucket of the exact value).
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Iterable

from pdserve.bench.metrics import LatencyStats, Slo, Summary, summarize
from pdserve.bench.records import FAILED, OK, RequestRecord
from pdserve.plan.sim_request import SimRequest

_LOW_S = 1e-6  # the histogram's first bucket starts here
_GROWTH = 1.002
_LOG_GROWTH = math.log(_GROWTH)
_NUM_BUCKETS = int(math.log(1e4 / _LOW_S) / _LOG_GROWTH) + 2


class ItlHistogram:
    """Inter-token gaps, bucketed; the engine models feed it (``TokenSink``)."""

    def __init__(self) -> None:
        self.counts = [0] * _NUM_BUCKETS
        self.total = 0
        self.sum_s = 0.0

    @staticmethod
    def bucket(seconds: float) -> int:
        if seconds <= _LOW_S:
            return 0
        return min(_NUM_BUCKETS - 1, 1 + int(math.log(seconds / _LOW_S) / _LOG_GROWTH))

    @staticmethod
    def value(bucket: int) -> float:
        if bucket == 0:
            return _LOW_S
        return _LOW_S * _GROWTH ** (bucket - 0.5)

    def gap(self, seconds: float) -> None:
        self.counts[self.bucket(seconds)] += 1
        self.total += 1
        self.sum_s += seconds

    def gaps(self, first_s: float, last_s: float, num_steps: int, weight: int) -> None:
        """``weight`` requests each saw ``num_steps`` gaps growing evenly from ``first_s``
        to ``last_s``."""
        if weight <= 0 or num_steps <= 0:
            return
        n = num_steps * weight
        self.total += n
        self.sum_s += (first_s + last_s) / 2 * n
        parts = 1 if num_steps == 1 or last_s - first_s < first_s * 0.004 else min(num_steps, 4)
        if parts == 1:
            self.counts[self.bucket((first_s + last_s) / 2)] += n
            return
        base, extra = divmod(num_steps, parts)
        for p in range(parts):
            steps = base + (1 if p < extra else 0)
            mid = first_s + (last_s - first_s) * (p + 0.5) / parts
            self.counts[self.bucket(mid)] += steps * weight

    def stats(self) -> LatencyStats | None:
        """Mean exact, percentiles as numpy's linear interpolation over the bucket values."""
        if self.total == 0:
            return None
        targets = [(self.total - 1) * q / 100.0 for q in (50.0, 95.0, 99.0)]
        out: list[float] = []
        seen = 0
        it = iter(targets)
        want = next(it)
        for b, c in enumerate(self.counts):
            if not c:
                continue
            seen += c
            while seen > want:
                out.append(self.value(b) * 1000.0)
                nxt = next(it, None)
                if nxt is None:
                    break
                want = nxt
            if len(out) == len(targets):
                break
        return LatencyStats(self.total, self.sum_s / self.total * 1000.0, *out)


class NullSink:
    """Discards gaps (a full recorder computes them from token times)."""

    def gap(self, seconds: float) -> None:
        pass

    def gaps(self, first_s: float, last_s: float, num_steps: int, weight: int) -> None:
        pass


def to_record(req: SimRequest, stream_s: float) -> RequestRecord:
    """A ``pdserve bench`` record of a simulated request (one token per streamed chunk)."""
    rec = RequestRecord(index=req.index, start_s=req.arrival_s, status=req.status)
    rec.num_prompt_tokens = req.num_prompt
    rec.has_shared_prefix = req.prefix_group >= 0
    if req.status != OK:
        rec.error = req.error or "failed"
        rec.e2e_s = None
        return rec
    rec.ttft_s = req.first_token_s + stream_s - req.arrival_s
    rec.e2e_s = req.finish_s + stream_s - req.arrival_s
    times = req.token_times or []
    rec.itl_s = [b - a for a, b in itertools.pairwise(times)]
    rec.num_output_tokens = req.num_output
    rec.num_chunks = req.num_output
    rec.num_cached_tokens = req.num_cached_tokens
    rec.usage_reported = True
    rec.finish_reason = "length"
    return rec


class FullRecorder:
    def __init__(self, stream_s: float) -> None:
        self.stream_s = stream_s
        self.records: list[RequestRecord] = []
        self.sink = NullSink()
        self.record_tokens = True

    def done(self, req: SimRequest) -> None:
        self.records.append(to_record(req, self.stream_s))

    def summary(self, duration_s: float, slo: Slo) -> Summary:
        self.records.sort(key=lambda r: r.index)
        return summarize(self.records, duration_s, slo)


class CompactRecorder:
    def __init__(self, stream_s: float) -> None:
        self.stream_s = stream_s
        self.sink = ItlHistogram()
        self.record_tokens = False
        self.ttft = array("d")
        self.e2e = array("d")
        self.tpot = array("d")  # NaN for one-token requests
        self.num_prompt = 0
        self.num_output = 0
        self.num_cached = 0
        self.num_failed = 0
        self.errors: dict[str, int] = {}

    def done(self, req: SimRequest) -> None:
        if req.status != OK:
            self.num_failed += 1
            key = (req.error or "unknown").splitlines()[0][:200]
            self.errors[key] = self.errors.get(key, 0) + 1
            return
        ttft = req.first_token_s + self.stream_s - req.arrival_s
        e2e = req.finish_s + self.stream_s - req.arrival_s
        self.ttft.append(ttft)
        self.e2e.append(e2e)
        n = req.num_output
        self.tpot.append((e2e - ttft) / (n - 1) if n >= 2 else math.nan)
        self.num_prompt += req.num_prompt
        self.num_output += n
        self.num_cached += req.num_cached_tokens

    def summary(self, duration_s: float, slo: Slo) -> Summary:
        import numpy as np

        ttft, e2e, tpot = (
            np.frombuffer(a, dtype=np.float64) for a in (self.ttft, self.e2e, self.tpot)
        )
        done = len(ttft)
        good = None
        if slo.is_set:
            ok = np.ones(done, dtype=bool)
            with np.errstate(invalid="ignore"):
                # Mean ITL of a one-token-per-chunk stream is its TPOT (no gaps: vacuous).
                for target, values in (
                    (slo.ttft_s, ttft),
                    (slo.itl_s, tpot),
                    (slo.tpot_s, tpot),
                    (slo.e2e_s, e2e),
                ):
                    if target is not None:
                        ok &= ~(values > target)
            good = int(ok.sum())
        dur = max(duration_s, 1e-9)
        return Summary(
            num_requests=done + self.num_failed,
            num_completed=done,
            num_failed=self.num_failed,
            num_cancelled=0,
            duration_s=duration_s,
            request_throughput=done / dur,
            input_token_throughput=self.num_prompt / dur,
            output_token_throughput=self.num_output / dur,
            total_input_tokens=self.num_prompt,
            total_output_tokens=self.num_output,
            total_cached_tokens=self.num_cached,
            ttft_ms=_stats(ttft),
            itl_ms=self.sink.stats(),
            tpot_ms=_stats(tpot[~np.isnan(tpot)]),
            e2e_ms=_stats(e2e),
            slo=slo.spec,
            num_good=good,
            goodput=None if good is None else good / dur,
            slo_attainment=None if good is None else (good / done if done else 0.0),
            errors=dict(self.errors),
        )


def _stats(values: Iterable[float]) -> LatencyStats | None:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return None
    ms = arr * 1000.0
    p50, p95, p99 = (float(x) for x in np.percentile(ms, [50.0, 95.0, 99.0]))
    return LatencyStats(int(arr.size), float(ms.mean()), p50, p95, p99)


Recorder = FullRecorder | CompactRecorder

__all__ = ["FAILED", "OK", "CompactRecorder", "FullRecorder", "ItlHistogram", "Recorder"]
