"""``pdserve_request_ttft_stage_seconds``: where time to first token goes, per stage.

Each process measures the stages it can see with its own clock (see docs/observability.md):

    router_queue      router: request received -> dispatched to the backend
    prefill_queue     engine that prefills: arrival -> first scheduled
    prefill_compute   engine that prefills: first scheduled -> first token sampled
    kv_transfer       prefill worker: first token sampled -> decode acknowledged the last blocks
    decode_admission  decode worker: all KV arrived -> first token sent to the router

One ``TtftStages`` per process registry, so the family is exposed once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric

from engine.metrics import Histogram, HistogramSnapshot
from pdserve.metrics.families import HistogramFamily

STAGES = ("router_queue", "prefill_queue", "prefill_compute", "kv_transfer", "decode_admission")


class TtftStages:
    def __init__(self, role: str, model: str) -> None:
        self._labels = {"role": role, "model": model}
        self._sources: dict[str, Callable[[], HistogramSnapshot]] = {}

    def add(self, stage: str, source: Histogram | Callable[[], HistogramSnapshot]) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown TTFT stage {stage!r}; known: {STAGES}")
        self._sources[stage] = source.snapshot if isinstance(source, Histogram) else source

    def collect(self) -> Iterator[Metric]:
        h = HistogramFamily(
            "pdserve_request_ttft_stage_seconds",
            "Time to first token spent in one stage (see docs/observability.md).",
            [*self._labels, "stage"],
        )
        for stage, source in self._sources.items():
            h.add({**self._labels, "stage": stage}, source())
        yield h.family
