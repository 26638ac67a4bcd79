"""``engine.resume``: a request continued on another engine from its snapshot (the earlier
outputs at the end of the prompt ids) comes out exactly as the uninterrupted run: the same
token ids, text, finish reason and logprobs, for greedy and seeded sampling, penalties,
min_tokens, and a stop string that straddles the switch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.resume import ResumeState
from engine.sampling_params import SamplingParams
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import assert_pool_free, random_prompts, run_to_completion
from tests.engine.test_hf_exactness import make_engine
from tests.hf_oracle import hf_greedy


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.fixture(scope="module")
def engines(llama: Path) -> tuple[LLMEngine, LLMEngine]:
    return make_engine(llama), make_engine(llama)


def _whole(engine: LLMEngine, rid: str, prompt: list[int], params: SamplingParams) -> RequestOutput:
    engine.add_request(rid, prompt_token_ids=prompt, sampling_params=params)
    return run_to_completion(engine)[rid]


def _migrated(
    first: LLMEngine,
    second: LLMEngine,
    rid: str,
    prompt: list[int],
    params: SamplingParams,
    switch_after: int,
) -> tuple[list[int], str, RequestOutput, list[float]]:
    """Run ``switch_after`` tokens on ``first``, then continue on ``second``; the client's
    view: every token id and text piece streamed, in order, and the last output."""
    first.add_request(rid, prompt_token_ids=prompt, sampling_params=params)
    ids: list[int] = []
    text = ""
    logprobs: list[float] = []
    while len(ids) < switch_after:
        for out in first.step():
            assert not out.finished, "finished before the switch"
            ids += out.new_token_ids
            text += out.new_text
            logprobs += [t.logprob or 0.0 for t in out.new_logprobs or ()]
    snap = first.snapshot(rid)
    assert snap is not None and list(snap.output_token_ids) == ids
    assert snap.emitted_text == text
    first.abort_request(rid)
    second.add_request(
        rid,
        prompt_token_ids=[*prompt, *ids],
        sampling_params=params,
        resume=ResumeState(len(ids), text),
    )
    last = None
    while second.has_unfinished_requests():
        for out in second.step():
            ids += out.new_token_ids
            text += out.new_text
            logprobs += [t.logprob or 0.0 for t in out.new_logprobs or ()]
            if out.finished:
                last = out
    assert last is not None
    assert_pool_free(first)
    assert_pool_free(second)
    return ids, text, last, logprobs


CASES = {
    "greedy": SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2),
    "seeded": SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=16, ignore_eos=True),
    "penalties": SamplingParams(
        temperature=0.8, seed=3, max_tokens=16, ignore_eos=True,
        presence_penalty=0.7, frequency_penalty=0.5, repetition_penalty=1.3,
    ),
    "min_tokens": SamplingParams(temperature=1.0, seed=5, max_tokens=24, min_tokens=12),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_resumed_request_equals_the_uninterrupted_run(
    engines: tuple[LLMEngine, LLMEngine], case: str
) -> None:
    first, second = engines
    params = CASES[case]
    prompt = random_prompts(1, 200, 24, 24, seed=11)[0]
    whole = _whole(first, f"{case}-whole", prompt, params)
    switch = min(6, len(whole.token_ids) - 1)
    ids, text, last, logprobs = _migrated(first, second, f"{case}-m", prompt, params, switch)
    assert ids == whole.token_ids
    assert text == whole.text
    assert (last.finish_reason, last.stop_reason) == (whole.finish_reason, whole.stop_reason)
    if params.logprobs is not None:
        assert whole.logprobs is not None
        assert logprobs == pytest.approx([t.logprob for t in whole.logprobs], abs=1e-5)
    if case == "greedy":
        assert ids == hf_greedy(Path(first.config.model or ""), prompt, 16)


def test_max_tokens_reached_by_the_first_token_after_the_switch(
    engines: tuple[LLMEngine, LLMEngine],
) -> None:
    first, second = engines
    params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    prompt = random_prompts(1, 200, 20, 20, seed=12)[0]
    whole = _whole(first, "len-whole", prompt, params)
    ids, _, last, _ = _migrated(first, second, "len-m", prompt, params, 6)
    assert ids == whole.token_ids and len(ids) == 7 and last.finish_reason == "length"


def test_a_stop_string_straddling_the_switch(engines: tuple[LLMEngine, LLMEngine]) -> None:
    first, second = engines
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompt = random_prompts(1, 200, 30, 30, seed=13)[0]
    whole = _whole(first, "stop-free", prompt, free)
    tok = first.tokenizer
    switch = 8
    # A stop string made of the last characters before the switch and the first after it,
    # chosen where it first occurs in the text.
    boundary = len(tok.decode(whole.token_ids[:switch], skip_special_tokens=True))
    stop = next(
        s
        for s in (whole.text[boundary - i : boundary + 3] for i in (3, 2, 4, 1))
        if len(s.strip()) >= 2 and whole.text.find(s) == boundary - len(s) + 3
    )
    params = dataclasses.replace(free, stop=(stop,))
    expected = _whole(first, "stop-whole", prompt, params)
    assert expected.finish_reason == "stop" and expected.stop_reason == stop
    ids, text, last, _ = _migrated(first, second, "stop-m", prompt, params, switch)
    assert ids == expected.token_ids and text == expected.text
    assert (last.finish_reason, last.stop_reason) == ("stop", stop)
    assert stop not in text


def test_resume_refuses_nonsense(engines: tuple[LLMEngine, LLMEngine]) -> None:
    first, _ = engines
    p = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match="resume: 5 generated tokens leave no prompt"):
        first.add_request("x", prompt_token_ids=[5] * 5, sampling_params=p,
                          resume=ResumeState(5))  # fmt: skip
    with pytest.raises(ValueError, match="nothing is left to generate"):
        first.add_request("x", prompt_token_ids=[5] * 9, sampling_params=p,
                          resume=ResumeState(4))  # fmt: skip
    with pytest.raises(ValueError, match="emitted_text"):
        first.add_request("x", prompt_token_ids=[5] * 9, sampling_params=p,
                          resume=ResumeState(2, "definitely not this"))  # fmt: skip
    assert first.snapshot("x") is None
    assert_pool_free(first)
