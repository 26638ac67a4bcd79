"""Greedy fp32 output equals Hugging Face generate, token for token, through every scheduler
path: batching, chunked prefill, prefix caching, preemption by swap and by recompute, aborts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.scheduler_output import SchedulerOutput
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import assert_pool_free, greedy, random_prompts, run_to_completion
from tests.hf_oracle import hf_greedy


def make_engine(folder: Path, **overrides: object) -> LLMEngine:
    options: dict[str, object] = dict(
        model=str(folder),
        dtype="float32",
        num_kv_blocks=512,
        num_host_blocks=256,
        max_num_batched_tokens=256,
        max_num_seqs=64,
    )
    options.update(overrides)
    return LLMEngine(EngineConfig(**options))  # type: ignore[arg-type]


def check_against_hf(
    folder: Path, prompts: list[list[int]], lengths: list[int], outs: dict
) -> None:
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        expected = hf_greedy(folder, prompt, n)
        got = outs[f"r{i}"].token_ids
        assert got == expected, f"request {i} (prompt {len(prompt)} tokens) diverged from HF"


def submit(engine: LLMEngine, prompts: list[list[int]], lengths: list[int]) -> None:
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", prompt_token_ids=prompt, sampling_params=greedy(n))


def assert_greedy_matches_hf(
    engine: LLMEngine, folder: Path, prompts: list[list[int]], lengths: list[int]
) -> None:
    """Run the prompts to completion: every request's tokens are HF's, every block is free."""
    submit(engine, prompts, lengths)
    outs = run_to_completion(engine)
    check_against_hf(folder, prompts, lengths, outs)
    assert_pool_free(engine)


def test_single_request(tiny_model: Path) -> None:
    engine = make_engine(tiny_model)
    vocab = engine.model_config.vocab_size
    prompts = random_prompts(1, vocab, 20, 20, seed=1)
    submit(engine, prompts, [24])
    outs = run_to_completion(engine)
    check_against_hf(tiny_model, prompts, [24], outs)
    assert outs["r0"].finish_reason == "length"
    assert_pool_free(engine)


def test_32_concurrent_mixed_lengths(tiny_model: Path) -> None:
    engine = make_engine(tiny_model)
    prompts = random_prompts(32, engine.model_config.vocab_size, 3, 90, seed=2)
    lengths = [random.Random(i).randint(1, 40) for i in range(32)]
    submit(engine, prompts, lengths)
    outs = run_to_completion(engine)
    check_against_hf(tiny_model, prompts, lengths, outs)
    assert_pool_free(engine)


def test_chunked_prefill_tiny_budget(tiny_model: Path) -> None:
    engine = make_engine(tiny_model, max_num_batched_tokens=7)
    prompts = random_prompts(6, engine.model_config.vocab_size, 10, 60, seed=3)
    lengths = [12, 5, 9, 16, 3, 10]
    submit(engine, prompts, lengths)
    outs = run_to_completion(engine)
    check_against_hf(tiny_model, prompts, lengths, outs)
    assert_pool_free(engine)


def test_prefix_caching_shared_prefixes(tiny_model: Path) -> None:
    engine = make_engine(tiny_model, max_num_batched_tokens=64)
    vocab = engine.model_config.vocab_size
    shared = random_prompts(1, vocab, 48, 48, seed=4)[0]
    tails = random_prompts(8, vocab, 1, 20, seed=5)
    prompts = [shared + t for t in tails] + [shared[:32]]  # the last is exactly 2 full blocks
    lengths = [8] * len(prompts)
    submit(engine, prompts, lengths)
    outs = run_to_completion(engine)
    check_against_hf(tiny_model, prompts, lengths, outs)
    stats = engine.scheduler.stats
    assert stats.num_prefix_hit_blocks > 0
    assert sum(o.num_cached_tokens for o in outs.values()) > 0
    # A second wave hits blocks cached by the first one, which are free but not evicted.
    submit2 = [shared + t for t in random_prompts(4, vocab, 1, 10, seed=6)]
    for i, p in enumerate(submit2):
        engine.add_request(f"s{i}", prompt_token_ids=p, sampling_params=greedy(6))
    outs2 = run_to_completion(engine)
    for i, p in enumerate(submit2):
        assert outs2[f"s{i}"].token_ids == hf_greedy(tiny_model, p, 6)
        assert outs2[f"s{i}"].num_cached_tokens == 48
    assert_pool_free(engine)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption(tiny_model: Path, mode: str) -> None:
    # 24 blocks of 16 tokens cannot hold 8 requests growing to ~90 tokens each.
    engine = make_engine(
        tiny_model,
        num_kv_blocks=24,
        num_host_blocks=64,
        preemption_mode=mode,
        max_num_batched_tokens=64,
    )
    prompts = random_prompts(8, engine.model_config.vocab_size, 20, 50, seed=7)
    lengths = [40] * 8
    submit(engine, prompts, lengths)
    outs = run_to_completion(engine)
    stats = engine.scheduler.stats
    if mode == "swap":
        assert stats.num_preemptions_swap > 0 and stats.num_preemptions_recompute == 0
        assert stats.num_blocks_swapped_in == stats.num_blocks_swapped_out > 0
    else:
        assert stats.num_preemptions_recompute > 0 and stats.num_preemptions_swap == 0
    check_against_hf(tiny_model, prompts, lengths, outs)
    assert_pool_free(engine)


def test_abort_mid_generation(tiny_model: Path) -> None:
    engine = make_engine(tiny_model, max_num_batched_tokens=32)
    prompts = random_prompts(6, engine.model_config.vocab_size, 10, 40, seed=8)
    lengths = [30] * 6
    submit(engine, prompts, lengths)
    final: dict = {}
    for step in range(1000):
        if not engine.has_unfinished_requests():
            break
        if step == 3:
            assert engine.abort_request("r1")  # mid-prefill or early decode
        if step == 8:
            assert engine.abort_request("r4")
            assert not engine.abort_request("r4")  # idempotent
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        engine.block_manager.check_integrity()
    assert "r1" not in final and "r4" not in final
    survivors = [0, 2, 3, 5]
    for i in survivors:
        assert final[f"r{i}"].token_ids == hf_greedy(tiny_model, prompts[i], 30)
    assert_pool_free(engine)


def test_mistral_sliding_window(model_factory) -> None:  # type: ignore[no-untyped-def]
    folder = model_factory("mistral", **TINY_ARCHS["mistral"])
    engine = make_engine(folder, max_num_batched_tokens=16)
    prompts = random_prompts(4, engine.model_config.vocab_size, 10, 40, seed=9)
    lengths = [30, 12, 25, 8]  # contexts beyond the 24-token window
    assert_greedy_matches_hf(engine, folder, prompts, lengths)


def test_llama3_rope_scaling(model_factory) -> None:  # type: ignore[no-untyped-def]
    folder = model_factory(
        "llama3rope",
        architecture="llama",
        max_position_embeddings=4096,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    )
    engine = make_engine(folder)
    prompts = random_prompts(3, engine.model_config.vocab_size, 30, 80, seed=10)
    submit(engine, prompts, [20, 20, 20])
    outs = run_to_completion(engine)
    check_against_hf(folder, prompts, [20, 20, 20], outs)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_triton_backend_matches_hf(model_factory, arch: str) -> None:  # type: ignore[no-untyped-def]
    """The GPU attention path (Triton kernels, here under the CPU interpreter) is exact too."""
    pytest.importorskip("triton")
    folder = model_factory(arch, **TINY_ARCHS[arch])
    engine = make_engine(folder, attention_backend="triton", max_num_batched_tokens=16)
    prompts = random_prompts(3, engine.model_config.vocab_size, 10, 30, seed=12)
    lengths = [6, 10, 4]
    assert_greedy_matches_hf(engine, folder, prompts, lengths)


def test_static_batching_matches_hf(tiny_model: Path) -> None:
    engine = make_engine(tiny_model, batching="static", max_num_seqs=4, max_num_batched_tokens=32)
    prompts = random_prompts(9, engine.model_config.vocab_size, 5, 50, seed=9)
    lengths = [random.Random(100 + i).randint(1, 20) for i in range(9)]
    submit(engine, prompts, lengths)
    outs = run_to_completion(engine)
    check_against_hf(tiny_model, prompts, lengths, outs)
    assert_pool_free(engine)


def test_prompts_prefilled_under_the_cap_beside_decodes(tiny_model: Path) -> None:
    """Prompts that arrive while others decode prefill at most 10 tokens a step beside them
    (``max_prefill_tokens_with_decodes``), and every stream is still HF's."""
    engine = make_engine(tiny_model, max_prefill_tokens_with_decodes=10)
    prompts = random_prompts(5, engine.model_config.vocab_size, 20, 60, seed=4)
    lengths = [24, 12, 16, 8, 10]
    steps: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recorded() -> SchedulerOutput:  # the real schedule, its outputs kept
        out = schedule()
        steps.append(out)
        return out

    engine.scheduler.schedule = recorded  # type: ignore[method-assign]
    final = {}
    for n in range(10_000):
        if n % 3 == 0 and n // 3 < len(prompts):  # one more every third step
            i = n // 3
            engine.add_request(
                f"r{i}", prompt_token_ids=prompts[i], sampling_params=greedy(lengths[i])
            )
        elif n // 3 >= len(prompts) and not engine.has_unfinished_requests():
            break
        final.update({o.request_id: o for o in engine.step() if o.finished})
    check_against_hf(tiny_model, prompts, lengths, final)
    assert_pool_free(engine)
    beside = [
        sum(x.num_scheduled_tokens for x in out.scheduled if x.num_scheduled_tokens > 1)
        for out in steps
        if any(
            x.num_scheduled_tokens == 1
            and x.num_computed_tokens >= len(prompts[int(x.request_id[1:])])
            for x in out.scheduled
        )
    ]
    assert beside and max(beside) == 10, beside  # prompts were cut to the cap beside decodes
