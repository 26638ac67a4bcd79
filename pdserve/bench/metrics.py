"""Summary statistics over request records: throughput, latency percentiles, SLO goodput."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pdserve.bench.records import CANCELLED, FAILED, OK, RequestRecord

PERCENTILES = (50.0, 95.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default). ValueError on no values."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class LatencyStats:
    """Milliseconds."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float

    @staticmethod
    def of_seconds(values: Sequence[float]) -> LatencyStats | None:
        if not values:
            return None
        ms = [v * 1000.0 for v in values]
        p50, p95, p99 = (percentile(ms, q) for q in PERCENTILES)
        return LatencyStats(len(ms), sum(ms) / len(ms), p50, p95, p99)


_SLO_KEYS = ("ttft", "itl", "tpot", "e2e")


@dataclass(frozen=True)
class Slo:
    """Per-request targets in seconds; a request is good when it completed and meets every
    target given: its TTFT, its mean inter-token gap (``itl``), its TPOT, its end-to-end."""

    ttft_s: float | None = None
    itl_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in asdict(self).values())

    @staticmethod
    def parse(spec: str | None) -> Slo:
        """``"ttft=500ms,itl=50ms"`` (units ms or s; a bare number is ms)."""
        if not spec:
            return Slo()
        targets: dict[str, float] = {}
        for part in spec.split(","):
            key, _, value = part.strip().partition("=")
            m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", value)
            if key not in _SLO_KEYS or not m:
                raise ValueError(
                    f"bad SLO {part!r}: use KEY=VALUE[ms|s] with KEY in {', '.join(_SLO_KEYS)}"
                )
            targets[f"{key}_s"] = float(m[1]) / (1.0 if m[2] == "s" else 1000.0)
        return Slo(**targets)

    @property
    def spec(self) -> str:
        return ",".join(
            f"{k}={v * 1000:g}ms" for k in _SLO_KEYS if (v := getattr(self, f"{k}_s")) is not None
        )

    def is_met(self, r: RequestRecord) -> bool:
        if r.status != OK:
            return False
        checks = (
            (self.ttft_s, r.ttft_s),
            (self.itl_s, r.mean_itl_s),
            (self.tpot_s, r.tpot_s),
            (self.e2e_s, r.e2e_s),
        )
        # A request with one output token has no gaps: its ITL/TPOT target holds vacuously.
        return all(t is None or v is None or v <= t for t, v in checks)


@dataclass(frozen=True)
class Summary:
    num_requests: int
    num_completed: int
    num_failed: int
    num_cancelled: int
    duration_s: float
    request_throughput: float  # completed requests / s
    input_token_throughput: float  # prompt tokens of completed requests / s
    output_token_throughput: float  # output tokens of completed requests / s
    total_input_tokens: int
    total_output_tokens: int
    total_cached_tokens: int | None
    ttft_ms: LatencyStats | None
    itl_ms: LatencyStats | None  # every inter-chunk gap of every completed request
    tpot_ms: LatencyStats | None  # one value per completed request with >= 2 output tokens
    e2e_ms: LatencyStats | None
    slo: str
    num_good: int | None  # completed requests meeting the SLO (None without an SLO)
    goodput: float | None  # good requests / s
    slo_attainment: float | None  # good / completed
    errors: dict[str, int]  # first line of each error message -> count

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> Summary:
    """Cancelled requests count on their own; they add to no latency or throughput figure."""
    done = [r for r in records if r.status == OK]
    dur = max(duration_s, 1e-9)
    out_tokens = sum(r.num_output_tokens for r in done)
    in_tokens = sum(r.num_prompt_tokens or 0 for r in done)
    cached = [r.num_cached_tokens for r in done if r.num_cached_tokens is not None]
    good = sum(slo.is_met(r) for r in done) if slo.is_set else None
    errors: dict[str, int] = {}
    for r in records:
        if r.status == FAILED:
            key = (r.error or "unknown").splitlines()[0][:200]
            errors[key] = errors.get(key, 0) + 1
    return Summary(
        num_requests=len(records),
        num_completed=len(done),
        num_failed=sum(r.status == FAILED for r in records),
        num_cancelled=sum(r.status == CANCELLED for r in records),
        duration_s=duration_s,
        request_throughput=len(done) / dur,
        input_token_throughput=in_tokens / dur,
        output_token_throughput=out_tokens / dur,
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        total_cached_tokens=sum(cached) if cached else None,
        ttft_ms=LatencyStats.of_seconds([r.ttft_s for r in done if r.ttft_s is not None]),
        itl_ms=LatencyStats.of_seconds([g for r in done for g in r.itl_s]),
        tpot_ms=LatencyStats.of_seconds([t for r in done if (t := r.tpot_s) is not None]),
        e2e_ms=LatencyStats.of_seconds([r.e2e_s for r in done if r.e2e_s is not None]),
        slo=slo.spec,
        num_good=good,
        goodput=None if good is None else good / dur,
        slo_attainment=None if good is None else (good / len(done) if done else 0.0),
        errors=errors,
    )
