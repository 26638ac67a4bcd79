"""Percentiles, SLO parsing, goodput and the summary, on scripted request records."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pdserve.bench.metrics import LatencyStats, Slo, percentile, summarize
from pdserve.bench.records import CANCELLED, FAILED, OK, RequestRecord


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentile_matches_numpy_linear(n: int) -> None:
    rng = random.Random(n)
    xs = [rng.lognormvariate(0, 1) for _ in range(n)]
    for q in (0, 1, 25, 50, 90, 95, 99, 99.9, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_by_hand_and_errors() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([10.0, 20.0], 99) == pytest.approx(19.9)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_stats_in_ms() -> None:
    s = LatencyStats.of_seconds([0.001 * i for i in range(1, 101)])
    assert s is not None
    assert (s.n, s.mean, s.p50) == (100, pytest.approx(50.5), pytest.approx(50.5))
    assert s.p95 == pytest.approx(95.05) and s.p99 == pytest.approx(99.01)
    assert LatencyStats.of_seconds([]) is None


def test_slo_parse() -> None:
    slo = Slo.parse("ttft=500ms,itl=50ms")
    assert (slo.ttft_s, slo.itl_s, slo.tpot_s, slo.e2e_s) == (0.5, 0.05, None, None)
    assert Slo.parse("ttft=2s, e2e=1500, tpot=0.5ms") == Slo(ttft_s=2.0, e2e_s=1.5, tpot_s=0.0005)
    assert Slo.parse(slo.spec) == slo and slo.spec == "ttft=500ms,itl=50ms"
    assert not Slo.parse(None).is_set and not Slo.parse("").is_set
    for bad in ("ttft", "ttft=fast", "latency=5ms", "ttft=5min", "ttft=-1ms"):
        with pytest.raises(ValueError):
            Slo.parse(bad)


def rec(
    i: int,
    *,
    status: str = OK,
    ttft: float = 0.1,
    gaps: tuple[float, ...] = (0.01, 0.01),
    prompt: int = 10,
    out: int | None = None,
    error: str | None = None,
) -> RequestRecord:
    n_out = len(gaps) + 1 if out is None else out
    return RequestRecord(
        index=i,
        start_s=float(i),
        status=status,
        ttft_s=ttft,
        e2e_s=ttft + sum(gaps),
        itl_s=list(gaps),
        num_prompt_tokens=prompt,
        num_output_tokens=n_out,
        num_chunks=len(gaps) + 1,
        usage_reported=True,
        error=error,
    )


def test_is_met_checks_each_target() -> None:
    slo = Slo.parse("ttft=200ms,itl=20ms")
    assert slo.is_met(rec(0))
    assert not slo.is_met(rec(0, ttft=0.3))
    assert not slo.is_met(rec(0, gaps=(0.01, 0.05)))  # mean gap 30 ms
    assert slo.is_met(rec(0, gaps=(0.005, 0.03)))  # mean gap 17.5 ms: one slow gap is fine
    assert slo.is_met(rec(0, gaps=()))  # one token: no gaps, ITL holds vacuously
    assert not slo.is_met(rec(0, status=FAILED))
    assert not slo.is_met(rec(0, status=CANCELLED))
    tpot = Slo.parse("tpot=11ms")  # (e2e - ttft) / (out - 1): 40 ms over 4 = 10 ms, over 2 = 20
    assert tpot.is_met(rec(0, gaps=(0.02, 0.02), out=5))
    assert not tpot.is_met(rec(0, gaps=(0.02, 0.02), out=3))
    assert Slo.parse("e2e=125ms").is_met(rec(0)) and not Slo.parse("e2e=115ms").is_met(rec(0))


def test_summary_counts_throughput_and_goodput() -> None:
    records = [
        rec(0, ttft=0.1, gaps=(0.01, 0.01, 0.01), prompt=100, out=8),  # good
        rec(1, ttft=0.6, gaps=(0.01,), prompt=50, out=4),  # TTFT misses
        rec(2, ttft=0.2, gaps=(0.1, 0.1), prompt=30, out=3),  # ITL misses
        rec(3, ttft=0.3, gaps=(0.02,), prompt=20, out=2),  # good
        rec(4, status=FAILED, error="HTTP 429: busy\nmore"),
        rec(5, status=FAILED, error="HTTP 429: busy"),
        rec(6, status=CANCELLED, prompt=999, out=999),
    ]
    s = summarize(records, duration_s=2.0, slo=Slo.parse("ttft=500ms,itl=50ms"))
    assert (s.num_requests, s.num_completed, s.num_failed, s.num_cancelled) == (7, 4, 2, 1)
    assert s.total_input_tokens == 200 and s.total_output_tokens == 17
    assert s.request_throughput == 2.0
    assert s.input_token_throughput == 100.0 and s.output_token_throughput == 8.5
    assert s.num_good == 2 and s.goodput == 1.0 and s.slo_attainment == 0.5
    assert s.errors == {"HTTP 429: busy": 2}
    assert s.ttft_ms is not None and s.ttft_ms.n == 4
    assert s.ttft_ms.p50 == pytest.approx(250.0) and s.ttft_ms.mean == pytest.approx(300.0)
    assert s.itl_ms is not None and s.itl_ms.n == 7  # every gap of the completed requests
    assert s.itl_ms.p50 == pytest.approx(10.0) and s.itl_ms.mean == pytest.approx(260 / 7)
    # TPOT per request: 30/7, 10/3, 200/2, 20/1 ms.
    assert s.tpot_ms is not None and s.tpot_ms.n == 4
    assert s.tpot_ms.mean == pytest.approx((30 / 7 + 10 / 3 + 100 + 20) / 4)
    assert s.e2e_ms is not None and s.e2e_ms.p99 == pytest.approx(
        float(np.percentile([130, 610, 400, 320], 99))
    )
    assert s.slo == "ttft=500ms,itl=50ms"


def test_summary_without_slo_or_completions() -> None:
    s = summarize([rec(0)], 1.0, Slo())
    assert s.goodput is None and s.num_good is None and s.slo_attainment is None
    empty = summarize([rec(0, status=FAILED)], 1.0, Slo.parse("ttft=1s"))
    assert empty.num_completed == 0 and empty.ttft_ms is None and empty.goodput == 0.0
    assert empty.slo_attainment == 0.0 and empty.output_token_throughput == 0.0


def test_record_json_round_trip() -> None:
    r = rec(3)
    assert RequestRecord.from_json(r.to_json()) == r
