"""The engine's prefill and decode roles, wired by hand in one process: a prefill engine exports
each chunk's finished blocks, they are copied into the blocks a decode engine reserved, and the
decode engine continues from the first token. Tokens must equal HF; both pools end free.
(kv_transfer moves the same blocks between processes; tests/kv_transfer covers that part.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import assert_pool_free, random_prompts, run_to_completion
from tests.engine.test_hf_exactness import make_engine
from tests.hf_oracle import hf_greedy


def disaggregated_generate(
    prefill: LLMEngine, decode: LLMEngine, prompts: list[list[int]], max_tokens: int
) -> tuple[dict[str, RequestOutput], int]:
    """Run every prompt through prefill -> copy -> decode. Returns outputs and blocks copied."""
    bs = prefill.block_manager.block_size
    reservations = {}
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        rid = f"r{i}"
        res = decode.reserve_remote_prefill(rid, prompt_token_ids=p, sampling_params=params)
        assert res is not None
        reservations[rid] = res
        prefill.add_request(
            rid,
            prompt_token_ids=p,
            export_kv=True,
            sampling_params=SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
        )
    sent: dict[str, set[int]] = {rid: set() for rid in reservations}
    copied = 0
    final: dict[str, RequestOutput] = {}
    while prefill.has_unfinished_requests():
        prefill.step()
        prefill.block_manager.check_integrity()
        for prog in prefill.take_prefill_progress():
            res = reservations[prog.request_id]
            num_full = prog.num_computed_tokens // bs
            ready = range(len(res.block_ids)) if prog.is_prompt_done else range(num_full)
            for idx in ready:
                if idx in res.cached_blocks or idx in sent[prog.request_id]:
                    continue
                # Push as soon as a chunk completes the block (the transfer overlaps compute).
                src, dst = prog.block_ids[idx], res.block_ids[idx]
                decode.kv_cache.pool[dst].copy_(prefill.kv_cache.pool[src])
                sent[prog.request_id].add(idx)
                copied += 1
            if prog.is_prompt_done:
                assert prog.first_token_id is not None
                assert prefill.release_kv(prog.request_id)
                out = decode.admit_remote_prefill(prog.request_id, prog.first_token_id)
                if out.finished:
                    final[out.request_id] = out
    final.update(run_to_completion(decode))
    return final, copied


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prefill_decode_roles_match_hf(model_factory, arch: str) -> None:  # type: ignore[no-untyped-def]
    folder: Path = model_factory(arch, **TINY_ARCHS[arch])
    prefill = make_engine(folder, max_num_batched_tokens=24)  # forces chunked prefill
    decode = make_engine(folder)
    vocab = prefill.model_config.vocab_size
    shared = random_prompts(1, vocab, 32, 32, seed=20)[0]
    prompts = random_prompts(5, vocab, 5, 70, seed=21) + [shared + [7, 8, 9]]
    outs, copied = disaggregated_generate(prefill, decode, prompts, max_tokens=12)
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(folder, p, 12), f"request {i}"
    # A second request with the shared prefix: decode already holds its 2 full blocks.
    res_before = copied
    outs2, copied2 = disaggregated_generate(prefill, decode, [shared + [10, 11]], max_tokens=5)
    assert outs2["r0"].token_ids == hf_greedy(folder, shared + [10, 11], 5)
    assert outs2["r0"].num_cached_tokens == 32
    assert copied2 == 1 and res_before > 0  # only the partial last block travelled
    assert_pool_free(prefill)
    assert_pool_free(decode)


def test_abort_during_remote_prefill_frees_both_sides(model_factory) -> None:  # type: ignore[no-untyped-def]
    folder = model_factory("llama", **TINY_ARCHS["llama"])
    prefill = make_engine(folder, max_num_batched_tokens=8)
    decode = make_engine(folder)
    p = random_prompts(1, prefill.model_config.vocab_size, 40, 40, seed=22)[0]
    assert decode.reserve_remote_prefill("a", prompt_token_ids=p) is not None
    prefill.add_request(
        "a", prompt_token_ids=p, export_kv=True, sampling_params=SamplingParams(max_tokens=1)
    )
    prefill.step()
    assert prefill.take_prefill_progress()[0].num_computed_tokens == 8
    assert prefill.abort_request("a") and decode.abort_request("a")
    assert not decode.abort_request("a")
    with pytest.raises(KeyError):
        decode.admit_remote_prefill("a", 5)
    assert_pool_free(prefill)
    assert_pool_free(decode)


def test_max_tokens_one_finishes_at_admission(model_factory) -> None:  # type: ignore[no-untyped-def]
    folder = model_factory("llama", **TINY_ARCHS["llama"])
    decode = make_engine(folder)
    p = random_prompts(1, decode.model_config.vocab_size, 20, 20, seed=23)[0]
    decode.reserve_remote_prefill(
        "a", prompt_token_ids=p, sampling_params=SamplingParams(max_tokens=1)
    )
    out = decode.admit_remote_prefill("a", 42, -0.5)
    assert out.finished and out.token_ids == [42] and out.finish_reason == "length"
    assert_pool_free(decode)
