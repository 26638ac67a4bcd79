"""``LLMEngine.snapshot``: a request as plain data, enough to continue it on another engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.request_snapshot import RequestSnapshot
from engine.sampling_params import SamplingParams
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import assert_pool_free, random_prompts, run_to_completion
from tests.engine.test_hf_exactness import make_engine
from tests.hf_oracle import hf_greedy


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


def test_snapshot_describes_the_request_and_round_trips(llama: Path) -> None:
    engine = make_engine(llama)
    prompt = random_prompts(1, 200, 20, 20, seed=4)[0]
    params = SamplingParams(temperature=0, max_tokens=10, min_tokens=6, seed=11, stop=["zz"])
    engine.add_request("a", prompt_token_ids=prompt, sampling_params=params, priority=3)
    for _ in range(4):
        engine.step()
    snap = engine.snapshot("a")
    assert snap is not None
    assert snap.status == "running" and snap.prompt_token_ids == tuple(prompt)
    assert len(snap.output_token_ids) == 4 == snap.num_sampled_tokens
    assert (snap.remaining_max_tokens, snap.remaining_min_tokens) == (6, 2)
    assert snap.seed == 11 and snap.priority == 3
    # The detokenizer holds back len("zz") - 1 characters (a stop string may complete there).
    text = engine.tokenizer.decode(list(snap.output_token_ids), skip_special_tokens=True)
    assert snap.emitted_text + snap.held_back_text == text
    assert len(snap.held_back_text) <= 1
    again = RequestSnapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert again == snap
    with pytest.raises(ValueError, match="missing"):
        RequestSnapshot.from_dict({k: v for k, v in snap.to_dict().items() if k != "status"})
    assert engine.snapshot("nope") is None
    engine.abort_request("a")
    assert engine.snapshot("a") is None
    assert_pool_free(engine)


def test_a_snapshot_continues_on_another_engine_token_for_token(llama: Path) -> None:
    prompt = random_prompts(1, 200, 30, 30, seed=6)[0]
    full = hf_greedy(llama, prompt, 14)
    first = make_engine(llama)
    first.add_request(
        "m",
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
    )
    for _ in range(6):
        first.step()
    snap = first.snapshot("m")
    assert snap is not None and snap.remaining_max_tokens is not None
    first.abort_request("m")
    second = make_engine(llama)
    resumed = SamplingParams(temperature=0, max_tokens=snap.remaining_max_tokens, ignore_eos=True)
    second.add_request(
        "m",
        prompt_token_ids=list(snap.prompt_token_ids + snap.output_token_ids),
        sampling_params=resumed,
    )
    rest = run_to_completion(second)["m"].token_ids
    assert list(snap.output_token_ids) + rest == full
    assert_pool_free(first)
    assert_pool_free(second)
