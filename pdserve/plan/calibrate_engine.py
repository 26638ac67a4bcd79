"""Calibration by driving the engine directly: time real ``LLMEngine.step()`` calls over a grid
of step compositions, and real swaps, in this process (imports torch; the simulator never
imports this module).

Each case builds requests, runs untimed steps until the batch has the wanted shape, then
times steps. The step's shape comes from the scheduler's own ``SchedulerOutput`` (a wrapper
put on ``Scheduler.schedule`` at run time; no engine code changes), so what is fitted is
the time of exactly the steps the engine ran:

    prefill   one fresh prompt of n tokens (max_tokens 1)            n in prefill_lens
    cached    a prompt of n new tokens over c cached ones (prefix)   n x c in cached grid
    multi     k fresh prompts of n tokens in one step
    decode    B requests decoding at context L                       B x L, B*L capped
    mixed     B decodes at context L plus one fresh n-token prefill
    swap      out and in of N blocks (engine.kv_cache)               N in swap_blocks
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pdserve.plan.profile_format import StepSample, SwapSample
from pdserve.plan.step_shape import StepShape


@dataclass(frozen=True)
class EngineGrid:
    prefill_lens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024)
    cached: tuple[tuple[int, int], ...] = ((64, 512), (256, 512), (64, 1536), (256, 1536))
    multi: tuple[tuple[int, int], ...] = ((4, 64), (8, 32), (4, 256))
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_contexts: tuple[int, ...] = (64, 256, 1024)
    max_decode_tokens: int = 32768  # B x L cap (KV memory)
    mixed: tuple[tuple[int, int, int], ...] = ((8, 256, 64), (8, 256, 256), (16, 256, 512))
    swap_blocks: tuple[int, ...] = (1, 16, 64, 256)
    repeats: int = 3  # timed steps per point (the fit takes each point's median)

    @staticmethod
    def quick() -> EngineGrid:
        """A small grid for tests and smoke runs (seconds on the demo model)."""
        return EngineGrid(
            prefill_lens=(16, 64, 256),
            cached=((32, 128),),
            multi=((2, 32),),
            decode_batches=(1, 4, 8),
            decode_contexts=(32, 128),
            mixed=((4, 64, 64),),
            swap_blocks=(4, 16),
            repeats=2,
        )


@dataclass
class EngineMeasurement:
    steps: list[StepSample] = field(default_factory=list)
    swaps: list[SwapSample] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


class _Driver:
    """An engine plus the last ``SchedulerOutput`` it ran."""

    def __init__(self, engine: Any, seed: int) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self.last: Any = None
        self._ids = 0
        schedule = engine.scheduler.schedule

        def capture() -> Any:
            self.last = schedule()
            return self.last

        engine.scheduler.schedule = capture

    def new_ids(self, n: int) -> list[int]:
        vocab = self.engine.model_config.vocab_size
        return [self.rng.randrange(10, vocab) for _ in range(n)]

    def add(self, ids: list[int], max_tokens: int) -> str:
        from engine.sampling_params import SamplingParams

        self._ids += 1
        rid = f"cal-{self._ids}"
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.engine.add_request(rid, prompt_token_ids=ids, sampling_params=params)
        return rid

    def timed_step(self) -> tuple[StepShape, float]:
        t0 = time.perf_counter()
        self.engine.step()
        seconds = time.perf_counter() - t0
        out = self.last
        shape = StepShape.of(
            [(s.num_scheduled_tokens, s.num_computed_tokens, s.sample) for s in out.scheduled]
        )
        return shape, seconds

    def drain(self) -> None:
        for rid in list(self.engine.scheduler.requests):
            self.engine.abort_request(rid)
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def prefill_until_decoding(self) -> None:
        """Step (untimed) until every running request is one token behind."""
        sched = self.engine.scheduler
        while len(sched.waiting) or any(
            r.num_tokens - r.num_computed_tokens > 1 for r in sched.running
        ):
            self.engine.step()


def _cases(grid: EngineGrid) -> Iterator[tuple[str, Callable[[_Driver], tuple[StepShape, float]]]]:
    for n in grid.prefill_lens:

        def prefill(d: _Driver, n: int = n) -> tuple[StepShape, float]:
            d.add(d.new_ids(n), 1)
            return d.timed_step()

        yield f"prefill n={n}", prefill
    for n, c in grid.cached:

        def cached(d: _Driver, n: int = n, c: int = c) -> tuple[StepShape, float]:
            prefix = d.new_ids(c)
            d.add(prefix, 1)
            d.engine.step()  # caches the prefix's full blocks
            d.add(prefix + d.new_ids(n), 1)
            return d.timed_step()

        yield f"cached n={n} c={c}", cached
    for k, n in grid.multi:

        def multi(d: _Driver, k: int = k, n: int = n) -> tuple[StepShape, float]:
            for _ in range(k):
                d.add(d.new_ids(n), 1)
            return d.timed_step()

        yield f"multi k={k} n={n}", multi
    for b in grid.decode_batches:
        for ctx in grid.decode_contexts:
            if b * ctx > grid.max_decode_tokens:
                continue

            def decode(d: _Driver, b: int = b, ctx: int = ctx) -> tuple[StepShape, float]:
                for _ in range(b):
                    d.add(d.new_ids(ctx), 10_000)
                d.prefill_until_decoding()
                return d.timed_step()

            yield f"decode B={b} L={ctx}", decode
    for b, ctx, n in grid.mixed:

        def mixed(d: _Driver, b: int = b, ctx: int = ctx, n: int = n) -> tuple[StepShape, float]:
            for _ in range(b):
                d.add(d.new_ids(ctx), 10_000)
            d.prefill_until_decoding()
            d.add(d.new_ids(n), 1)
            return d.timed_step()

        yield f"mixed B={b} L={ctx} n={n}", mixed


def measure_engine(
    engine: Any,
    grid: EngineGrid,
    seed: int = 0,
    log: Callable[[str], None] = lambda _s: None,
) -> EngineMeasurement:
    """Time every case of ``grid`` on ``engine`` (an ``LLMEngine`` with room for the grid's
    largest batch, prefix caching on, a budget >= the longest prompt). The engine is left
    empty."""
    d = _Driver(engine, seed)
    m = EngineMeasurement()
    for _ in range(2):  # warm-up: first calls allocate and JIT-select kernels
        d.add(d.new_ids(64), 4)
        while engine.has_unfinished_requests():
            engine.step()
    for label, case in _cases(grid):
        times = []
        shape = StepShape()
        for _ in range(grid.repeats):
            shape, seconds = case(d)
            d.drain()
            times.append(seconds)
        m.steps.append(StepSample(label, shape, statistics.median(times), tuple(times)))
        log(f"{label}: {statistics.median(times) * 1000:.1f} ms (of {len(times)})")
    m.swaps = _measure_swaps(engine, grid)
    return m


def _measure_swaps(engine: Any, grid: EngineGrid) -> list[SwapSample]:
    kv = engine.kv_cache
    out = []
    for n in grid.swap_blocks:
        n = min(n, kv.num_blocks, kv.num_host_blocks)
        if n < 1:
            continue
        pairs = [(i, i) for i in range(n)]
        outs, ins = [], []
        for _ in range(grid.repeats):
            t0 = time.perf_counter()
            kv.swap_out(pairs)
            t1 = time.perf_counter()
            kv.swap_in(pairs)
            t2 = time.perf_counter()
            outs.append(t1 - t0)
            ins.append(t2 - t1)
        out.append(SwapSample(n, statistics.median(outs), statistics.median(ins)))
    return out


def build_engine(
    model: str,
    num_threads: int,
    cpus: set[int] | None,
    grid: EngineGrid,
    block_size: int = 16,
    device: str = "cpu",
) -> Any:
    """An engine sized for ``grid``, pinned to ``cpus`` (like ``taskset``) with ``num_threads``
    torch threads."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    from engine.engine_config import EngineConfig
    from engine.llm_engine import LLMEngine

    longest = max(
        [*grid.prefill_lens, *(n + c for n, c in grid.cached), *(k * n for k, n in grid.multi)]
        + [b * c + n for b, c, n in grid.mixed]
    )
    tokens = max(grid.max_decode_tokens, longest) + 4096
    num_blocks = -(-tokens // block_size)
    config = EngineConfig(
        model=model,
        dtype="float32",
        device=device,
        block_size=block_size,
        num_kv_blocks=num_blocks,
        num_host_blocks=max(grid.swap_blocks),
        max_num_seqs=max(max(grid.decode_batches), *(b + 1 for b, _, _ in grid.mixed)),
        max_num_batched_tokens=max(longest, 2048),
        max_model_len=max(longest, max(grid.decode_contexts) + 64, 2048) + 64,
        skip_tokenizer_init=True,
        num_threads=num_threads,
    )
    return LLMEngine(config)
