"""The engine's greedy rows on the screened lm_head (engine/models/greedy_head.py): the same
tokens as the float32 logits give, in a batch that mixes them with rows that need the logits
(logprobs, a repetition penalty, a min_tokens ban, a logit bias, seeded sampling), through
chunked prefill; the greedy rows are HF's, and every block is free after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.models.greedy_head import GREEDY_HEAD_ENV, GreedyLmHead
from engine.sampling_params import SamplingParams
from tests.engine.engine_utils import assert_pool_free, greedy, random_prompts, run_to_completion
from tests.engine.test_hf_exactness import check_against_hf, make_engine
from tests.kernels.test_greedy_head import screen_ops

N = 14
PARAMS = [
    greedy(N),
    greedy(N),
    greedy(N),
    SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, logprobs=3),
    SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, max_tokens=N, min_tokens=6),
    SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, logit_bias={17: 40.0}),
    SamplingParams(temperature=0.9, max_tokens=N, ignore_eos=True, seed=11),
]


@pytest.mark.parametrize("tied", [True, False])
def test_greedy_rows_take_the_screen_and_keep_their_tokens(
    model_factory: Any, monkeypatch: pytest.MonkeyPatch, tied: bool
) -> None:
    screen_ops()
    folder: Path = model_factory(
        f"llama-greedy-head-{tied}", architecture="llama", tie_word_embeddings=tied
    )
    prompts = random_prompts(len(PARAMS), 256, 5, 50, seed=21)

    def run(on: bool) -> tuple[dict, int]:
        monkeypatch.setenv(GREEDY_HEAD_ENV, "1" if on else "0")
        engine = make_engine(folder, max_num_batched_tokens=48)
        model = engine.runner.model
        assert model.has_greedy_head is on
        if on:
            head = model.lm_head
            assert isinstance(head, GreedyLmHead) and (head.rows is not None) is tied
        screened = 0
        greedy_tokens = model.greedy_tokens

        def counting(hidden):  # type: ignore[no-untyped-def]
            nonlocal screened
            screened += hidden.shape[0]
            return greedy_tokens(hidden)

        setattr(model, "greedy_tokens", counting)  # noqa: B010 (a method)
        for i, (prompt, params) in enumerate(zip(prompts, PARAMS, strict=True)):
            engine.add_request(f"r{i}", prompt_token_ids=prompt, sampling_params=params)
        outs = run_to_completion(engine)
        assert_pool_free(engine)
        return outs, screened

    on, screened = run(True)
    off, none = run(False)
    # Plain greedy rows (3 of N tokens each, the min_tokens row once past its ban) took it.
    assert none == 0 and screened >= 3 * N
    for name in off:
        assert on[name].token_ids == off[name].token_ids, name
        assert on[name].logprobs == off[name].logprobs, name
    check_against_hf(folder, prompts[:3], [N] * 3, on)
