"""The open loop's Poisson arrival process, checked statistically with fixed seeds."""

from __future__ import annotations

import math
import statistics

import pytest

from pdserve.bench.arrivals import poisson_arrival_times


@pytest.mark.parametrize("rate", [0.5, 4.0, 100.0])
def test_gaps_are_exponential_with_mean_one_over_rate(rate: float) -> None:
    times = poisson_arrival_times(rate, 20000, seed=3)
    assert times == sorted(times) and times[0] > 0
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.03)  # CV of exponential
    # Kolmogorov-Smirnov distance to Exp(rate); 1.63/sqrt(n) is the 1% critical value.
    xs = sorted(gaps)
    n = len(xs)
    d = max(
        max((i + 1) / n - (1 - math.exp(-rate * x)), (1 - math.exp(-rate * x)) - i / n)
        for i, x in enumerate(xs)
    )
    assert d < 1.63 / math.sqrt(n)


def test_counts_per_window_are_poisson() -> None:
    rate = 5.0
    times = poisson_arrival_times(rate, 50000, seed=11)
    windows = int(times[-1])
    counts = [0] * windows
    for t in times:
        if t < windows:
            counts[int(t)] += 1
    mean, var = statistics.fmean(counts), statistics.pvariance(counts)
    assert mean == pytest.approx(rate, rel=0.03)
    assert var / mean == pytest.approx(1.0, abs=0.08)  # Poisson: variance equals mean
    p0 = counts.count(0) / windows
    assert p0 == pytest.approx(math.exp(-rate), abs=0.004)


def test_seeded_and_scaled() -> None:
    a = poisson_arrival_times(2.0, 100, seed=1)
    assert a == poisson_arrival_times(2.0, 100, seed=1)
    assert a != poisson_arrival_times(2.0, 100, seed=2)
    # The same seed at another rate is the same pattern, scaled: sweeps compare like with like.
    b = poisson_arrival_times(4.0, 100, seed=1)
    assert [x / 2 for x in a] == pytest.approx(b)


def test_infinite_rate_and_errors() -> None:
    assert poisson_arrival_times(math.inf, 3, seed=0) == [0.0, 0.0, 0.0]
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError):
            poisson_arrival_times(bad, 3, seed=0)
