"""Penalties, logit bias and structured outputs in the batched sampler, on a real engine:
repetition penalty equals HF ``generate(repetition_penalty=...)`` token for token; OpenAI's
presence/frequency penalties and logit bias match a plain reference; every structured output
parses and validates, in a batch that mixes structured and free rows."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from engine.logits_processors import apply_logit_bias, apply_penalties
from engine.sampler import Sampler, SamplingRow
from engine.structured.spec import StructuredOutput
from pdserve import LLM, SamplingParams
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import random_prompts
from tests.hf_oracle import hf_greedy


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.fixture(scope="module")
def llm(llama: Path) -> LLM:
    return LLM(str(llama), dtype="float32", num_kv_blocks=128)


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_equals_hf_generate(llm: LLM, llama: Path, penalty: float) -> None:
    prompts = random_prompts(3, llm.engine.model_config.vocab_size, 4, 20, seed=3)
    params = SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=penalty
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)  # one batch
    for p, o in zip(prompts, outs, strict=True):
        assert o.token_ids == hf_greedy(llama, p, 12, repetition_penalty=penalty)
    plain = llm.generate({"prompt_token_ids": prompts[0]}, SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True))[0]  # fmt: skip
    assert plain.token_ids == hf_greedy(llama, prompts[0], 12)


def _row(rid: str, params: SamplingParams, out: tuple[int, ...], prompt: tuple[int, ...]):
    return SamplingRow(rid, params, len(out), out, prompt)


def test_openai_penalties_and_bias_are_batched_and_exact() -> None:
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(3, vocab)
    p0 = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    p1 = SamplingParams()
    p2 = SamplingParams(frequency_penalty=-1.0, logit_bias={7: 5.0, 9: -100.0})
    rows = [_row("a", p0, (3, 3, 4), (1,)), _row("b", p1, (3,), ()), _row("c", p2, (7, 7), ())]
    got = apply_logit_bias(apply_penalties(logits, rows), [r.params for r in rows])
    want = logits.clone()
    want[0, 3] -= 0.25 * 2 + 0.5
    want[0, 4] -= 0.25 * 1 + 0.5
    want[2, 7] += 1.0 * 2 + 5.0
    want[2, 9] -= 100.0
    torch.testing.assert_close(got, want)
    # Greedy with a large bias picks the biased token; the input logits are untouched.
    s = Sampler()
    params = SamplingParams(temperature=0.0, logit_bias={11: 100.0})
    assert [t.token_id for t in s.sample(logits, [_row(str(i), params, (), ()) for i in range(3)])
            ] == [11, 11, 11]  # fmt: skip
    assert not torch.equal(got, logits)


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
     "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {
        "type": "number", "minimum": -1, "maximum": 1}}, "required": ["ok", "score"],
     "additionalProperties": False},
]  # fmt: skip


def test_structured_outputs_validate_in_a_mixed_batch(llm: LLM) -> None:
    specs = [StructuredOutput("json", json.dumps(s)) for s in SCHEMAS]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=200, structured=s)
              for i, s in enumerate(specs)]  # fmt: skip
    free = SamplingParams(temperature=1.0, seed=9, max_tokens=20, ignore_eos=True)
    prompts = ["give me json", "colours", "a score", "free text"]
    outs = llm.generate(prompts, [*params, free])
    for schema, o in zip(SCHEMAS, outs, strict=False):
        assert o.finish_reason == "stop", o
        jsonschema.validate(json.loads(o.text), schema)
    assert len(outs[3].token_ids) == 20
    regex = llm.generate("x", SamplingParams(
        max_tokens=40, structured=StructuredOutput("regex", r"[0-9]{3}-[a-z]{2}")))[0]  # fmt: skip
    assert regex.finish_reason == "stop" and len(regex.text) == 6 and regex.text[3] == "-"
    choice = llm.generate("x", SamplingParams(
        max_tokens=40, structured=StructuredOutput("choice", '["yes", "no"]')))[0]  # fmt: skip
    assert choice.text in ("yes", "no")
    with pytest.raises(ValueError, match="response_format"):
        llm.generate("x", SamplingParams(structured=StructuredOutput("regex", "[a-")))


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_structured_outputs_survive_preemption(llama: Path, mode: str) -> None:
    """Grammar state lives with the request's output tokens, so preempted structured requests
    produce exactly what an unpreempted run produces, and it validates."""
    from tests.engine.engine_utils import assert_pool_free, run_to_completion
    from tests.engine.test_hf_exactness import make_engine

    schemas = [SCHEMAS[0], SCHEMAS[2], SCHEMAS[1]] * 3
    prompts = random_prompts(len(schemas), 800, 20, 50, seed=5)
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=60, repetition_penalty=1.1,
                       structured=StructuredOutput("json", json.dumps(s)))
        for i, s in enumerate(schemas)
    ]  # fmt: skip

    def run(num_kv_blocks: int) -> tuple[dict[str, list[int]], dict[str, str], object]:
        engine = make_engine(
            llama, num_kv_blocks=num_kv_blocks, num_host_blocks=64, preemption_mode=mode,
            max_num_batched_tokens=64,
        )  # fmt: skip
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(f"s{i}", prompt_token_ids=p, sampling_params=sp)
        outs = run_to_completion(engine)
        stats = engine.scheduler.stats
        assert_pool_free(engine)
        ids = {k: o.token_ids for k, o in outs.items()}
        return ids, {k: o.text for k, o in outs.items()}, stats

    roomy_ids, _, _ = run(512)
    tight_ids, texts, stats = run(20)
    assert stats.num_preemptions > 0  # type: ignore[attr-defined]
    assert tight_ids == roomy_ids
    for i, schema in enumerate(schemas):
        jsonschema.validate(json.loads(texts[f"s{i}"]), schema)
