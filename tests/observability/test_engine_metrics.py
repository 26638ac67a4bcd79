"""Engine metrics move exactly as a scripted request sequence says, read the way Prometheus
reads them: through the ``/metrics`` collectors of a real ``AsyncEngine``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.metrics import Histogram
from engine.sampling_params import SamplingParams
from pdserve.metrics.engine_collector import EngineCollector
from pdserve.metrics.stages import TtftStages
from tests.conftest import TINY_ARCHS

L = {"role": "decode", "model": "tiny"}


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


class Scrape:
    def __init__(self, engine: AsyncEngine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, "decode", "tiny"))
        stages = TtftStages("decode", "tiny")
        stages.add("prefill_queue", engine.engine.metrics.queue_seconds)
        stages.add("prefill_compute", engine.engine.metrics.prefill_seconds)
        self.registry.register(stages)

    def __call__(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, {**L, **labels})
        assert value is not None, f"{name}{labels} not exported"
        return value


@pytest.fixture
def engine(model_factory: Any) -> Any:
    model: Path = model_factory("llama", **TINY_ARCHS["llama"])
    config = EngineConfig(
        model=str(model),
        dtype="float32",
        block_size=4,
        num_kv_blocks=3,
        num_host_blocks=8,
        preemption_mode="swap",
        max_num_batched_tokens=64,
        skip_tokenizer_init=True,
    )
    aengine = AsyncEngine(LLMEngine(config))
    try:
        yield aengine
    finally:
        aengine.shutdown()


def run(engine: AsyncEngine, requests: list[tuple[str, list[int], int]]) -> None:
    """Add every request in one engine-thread call (so they share the first step), then wait
    until the engine is idle again."""

    def add(e: LLMEngine) -> None:
        for rid, ids, n in requests:
            e.add_request(rid, prompt_token_ids=ids, sampling_params=greedy(n))

    async def go() -> None:
        await engine.call(add)
        deadline = time.monotonic() + 60
        while await engine.call(lambda e: e.has_unfinished_requests()):
            assert time.monotonic() < deadline, "engine did not finish"
            await asyncio.sleep(0.01)

    asyncio.run(go())


def test_scripted_sequence(engine: AsyncEngine) -> None:
    scrape = Scrape(engine)
    assert scrape("pdserve_engine_steps_total") == 0
    assert scrape("pdserve_engine_kv_blocks") == 3
    assert scrape("pdserve_engine_kv_usage_ratio") == 0
    assert scrape("pdserve_engine_preemptions_total", mode="swap") == 0

    # One request: 9 prompt tokens (2 full blocks looked up, 1 token always computed),
    # 2 output tokens: a prefill step (9 tokens) then one decode step (1 token).
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    run(engine, [("a", prompt, 2)])
    assert scrape("pdserve_engine_steps_total") == 2
    assert scrape("pdserve_engine_step_seconds_count") == 2
    assert scrape("pdserve_engine_step_tokens_sum") == 9 + 1
    assert scrape("pdserve_engine_step_tokens_bucket", le="8.0") == 1  # the decode step
    assert scrape("pdserve_engine_step_requests_sum") == 2
    assert scrape("pdserve_engine_generation_tokens_total") == 2
    assert scrape("pdserve_engine_prefix_cache_query_blocks_total") == 2
    assert scrape("pdserve_engine_prefix_cache_hit_blocks_total") == 0
    for stage in ("prefill_queue", "prefill_compute"):
        assert scrape("pdserve_request_ttft_stage_seconds_count", stage=stage) == 1
    assert scrape("pdserve_engine_kv_free_blocks") == 3
    assert scrape("pdserve_engine_requests", state="running") == 0

    # The same prompt again: both looked-up blocks come from the prefix cache.
    run(engine, [("b", prompt, 2)])
    assert scrape("pdserve_engine_prefix_cache_query_blocks_total") == 4
    assert scrape("pdserve_engine_prefix_cache_hit_blocks_total") == 2
    assert scrape("pdserve_engine_steps_total") == 4
    assert scrape("pdserve_engine_step_tokens_sum") == 10 + 1 + 1  # 8 tokens were cached

    # Two 4-token prompts in 3 blocks: both prefill (1 block each); at the next step both
    # need a second block and one is left, so the later one is swapped out (1 block); the
    # first then finishes and the second comes back (1 block). Exactly one preemption.
    run(engine, [("c", [20, 21, 22, 23], 2), ("d", [30, 31, 32, 33], 2)])
    assert scrape("pdserve_engine_preemptions_total", mode="swap") == 1
    assert scrape("pdserve_engine_preemptions_total", mode="recompute") == 0
    assert scrape("pdserve_engine_swapped_blocks_total", direction="out") == 1
    assert scrape("pdserve_engine_swapped_blocks_total", direction="in") == 1
    assert scrape("pdserve_engine_generation_tokens_total") == 2 + 2 + 2 + 2
    assert scrape("pdserve_request_ttft_stage_seconds_count", stage="prefill_queue") == 4
    assert scrape("pdserve_engine_kv_host_usage_ratio") == 0
    assert scrape("pdserve_engine_kv_free_blocks") == 3


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 3.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap.cumulative() == [(1.0, 2), (2.0, 3), (float("inf"), 4)]
    assert snap.count == 4 and snap.sum == 6.0
    with pytest.raises(ValueError):
        Histogram((2.0, 1.0))
