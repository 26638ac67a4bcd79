"""Arrival processes for the open loop."""

from __future__ import annotations

import math
import random


def poisson_arrival_times(rate: float, num: int, seed: int) -> list[float]:
    """Send times (seconds from the start) of ``num`` Poisson arrivals at ``rate`` per second:
    exponential gaps with mean ``1 / rate``, the first one included. ``rate`` inf = all at 0."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(f"{seed}/arrivals")
    t, times = 0.0, []
    for _ in range(num):
        t += rng.expovariate(rate)
        times.append(t)
    return times
