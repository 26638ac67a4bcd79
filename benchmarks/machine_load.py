"""How busy the machine is around a benchmark: wait for other jobs to go quiet, read the load
average (``offline_throughput.py``)."""

from __future__ import annotations

import os
import sys
import time


def _busy_share(window_s: float) -> float:
    """Busy share of all cores over the next ``window_s`` seconds (this process is idle)."""

    def jiffies() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)

    busy0, total0 = jiffies()
    time.sleep(window_s)
    busy1, total1 = jiffies()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_for_quiet(max_wait_s: float, threshold: float) -> dict[str, float]:
    """Wait (at most ``max_wait_s``) until other jobs use under ``threshold`` of the cores
    over a 5 s window. Returns how long it waited and the last window's busy share."""
    start = time.perf_counter()
    busy = _busy_share(1.0)
    while busy >= threshold and time.perf_counter() - start < max_wait_s:
        busy = _busy_share(5.0)
    waited = time.perf_counter() - start
    if busy >= threshold:
        print(
            f"machine still {busy:.0%} busy after waiting {waited:.0f} s; going ahead",
            file=sys.stderr,
            flush=True,
        )
    return {"waited_s": waited, "busy_share_before": busy}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
