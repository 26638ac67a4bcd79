"""Drive an engine step by step, checking the block manager's invariants after every step."""

from __future__ import annotations

import random

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


def run_to_completion(engine: LLMEngine, max_steps: int = 100_000) -> dict[str, RequestOutput]:
    final: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        engine.block_manager.check_integrity()
    assert not engine.has_unfinished_requests(), "engine did not finish in time"
    return final


def assert_pool_free(engine: LLMEngine) -> None:
    engine.block_manager.check_integrity()
    assert engine.block_manager.is_idle(), "blocks still held after every request finished"
    assert not engine.scheduler.running and not engine.scheduler.swapped
    assert len(engine.scheduler.waiting) == 0


def random_prompts(
    n: int, vocab: int, min_len: int, max_len: int, seed: int = 0
) -> list[list[int]]:
    rng = random.Random(seed)
    # Skip the special tokens (ids 0..2) so prompts look like text.
    return [
        [rng.randrange(3, vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)
    ]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
