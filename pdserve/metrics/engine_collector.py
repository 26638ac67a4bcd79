"""Engine gauges, counters and histograms of one ``AsyncEngine``, read at scrape time.

Sources (both safe to read from the scrape thread): ``AsyncEngine.stats`` (the frozen
``EngineStats`` snapshot the engine thread publishes: gauges and counters) and
``AsyncEngine.metrics`` (locked histograms).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from engine.async_engine import AsyncEngine
from pdserve.metrics.families import Families, HistogramFamily


class EngineCollector:
    """``pdserve_engine_*`` for one engine, labelled ``role`` and ``model``."""

    def __init__(self, engine: AsyncEngine, role: str, model: str) -> None:
        self._engine = engine
        self._labels = {"role": role, "model": model}

    def collect(self) -> Iterator[Metric]:
        names = list(self._labels)
        values = list(self._labels.values())
        s = self._engine.stats
        m = self._engine.metrics.snapshot()

        requests = GaugeMetricFamily(
            "pdserve_engine_requests",
            "Requests in the engine by scheduler state (running, waiting, swapped, "
            "waiting_for_remote_kv).",
            labels=[*names, "state"],
        )
        requests.add_metric([*values, "running"], s.num_running)
        requests.add_metric([*values, "waiting"], s.num_waiting)
        requests.add_metric([*values, "swapped"], s.num_swapped)
        requests.add_metric([*values, "waiting_for_remote_kv"], s.num_waiting_for_remote_kv)
        yield requests

        families = Families(names, values)
        gauge, counter = families.gauge, families.counter

        yield gauge("pdserve_engine_kv_blocks", "KV blocks in the device pool.", s.num_blocks)
        yield gauge(
            "pdserve_engine_kv_free_blocks",
            "Free KV blocks in the device pool (cached-but-unused blocks count as free).",
            s.num_free_blocks,
        )
        yield gauge(
            "pdserve_engine_kv_usage_ratio",
            "Fraction of device KV blocks in use (0..1).",
            s.kv_usage,
        )
        host_usage = 1.0 - s.num_free_host_blocks / s.num_host_blocks if s.num_host_blocks else 0.0
        yield gauge(
            "pdserve_engine_kv_host_usage_ratio",
            "Fraction of host (swap) KV blocks in use (0..1; 0 without a host tier).",
            host_usage,
        )
        preemptions = CounterMetricFamily(
            "pdserve_engine_preemptions",
            "Requests preempted because KV blocks ran out, by mode (swap, recompute).",
            labels=[*names, "mode"],
        )
        preemptions.add_metric([*values, "swap"], s.num_preemptions_swap)
        preemptions.add_metric([*values, "recompute"], s.num_preemptions_recompute)
        yield preemptions
        swapped = CounterMetricFamily(
            "pdserve_engine_swapped_blocks",
            "KV blocks copied between the device pool and host memory, by direction (out, in).",
            labels=[*names, "direction"],
        )
        swapped.add_metric([*values, "out"], s.num_blocks_swapped_out)
        swapped.add_metric([*values, "in"], s.num_blocks_swapped_in)
        yield swapped
        yield counter(
            "pdserve_engine_prefix_cache_query_blocks",
            "Full prompt blocks looked up in the prefix cache at admission.",
            s.num_prefix_query_blocks,
        )
        yield counter(
            "pdserve_engine_prefix_cache_hit_blocks",
            "Prompt blocks found in the prefix cache (not recomputed).",
            s.num_prefix_hit_blocks,
        )
        yield counter("pdserve_engine_steps", "Engine steps executed.", s.num_steps)
        yield counter(
            "pdserve_engine_invariant_checks",
            "KV pool invariant checks run (whenever the engine goes idle, or every step with "
            "--check-invariants).",
            s.num_invariant_checks,
        )
        yield counter(
            "pdserve_engine_invariant_failures",
            "KV pool invariant checks that failed (a bug: blocks leaked or double-owned).",
            s.num_invariant_failures,
        )
        yield counter(
            "pdserve_engine_generation_tokens",
            "Tokens this engine sampled (a remote prefill's first token not included).",
            m.num_generation_tokens,
        )
        yield counter(
            "pdserve_engine_prompt_tokens_computed",
            "Prompt tokens run through the model (prefill compute; prefix-cache hits excluded, "
            "recompute preemption counted again).",
            m.num_prompt_tokens_computed,
        )
        for name, doc, snap in (
            ("pdserve_engine_step_seconds", "Wall time of one engine step.", m.step_seconds),
            (
                "pdserve_engine_step_tokens",
                "Tokens computed in one step (prefill chunks plus decodes): the batch size.",
                m.step_tokens,
            ),
            ("pdserve_engine_step_requests", "Requests in one step's batch.", m.step_requests),
        ):
            h = HistogramFamily(name, doc, names)
            h.add(self._labels, snap)
            yield h.family
