"""The offline API end to end: prompt forms, logprobs vs HF, seeds, stop strings, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from pdserve import LLM, SamplingParams
from tests.conftest import TINY_ARCHS
from tests.engine.engine_utils import assert_pool_free, greedy, random_prompts
from tests.hf_oracle import hf_greedy, hf_logprobs


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.fixture(scope="module")
def llm(llama: Path) -> LLM:
    return LLM(str(llama), dtype="float32", num_kv_blocks=256, num_host_blocks=64)


def test_prompt_forms_and_per_prompt_params(llm: LLM, llama: Path) -> None:
    ids = llm.tokenizer.encode("the model serves tokens")
    outs = llm.generate(
        [
            "the model serves tokens",
            {"prompt_token_ids": ids},
            {"prompt": "the model serves tokens"},
            ids,
        ],
        [greedy(5), greedy(5), greedy(7), greedy(3)],
    )
    expected = hf_greedy(llama, ids, 7)
    assert [o.token_ids for o in outs] == [expected[:5], expected[:5], expected, expected[:3]]
    assert outs[0].text == llm.tokenizer.decode(expected[:5])
    assert outs[0].prompt == "the model serves tokens" and outs[0].prompt_token_ids == ids
    single = llm.generate(ids, greedy(2))  # one prompt as a bare id list
    assert len(single) == 1 and single[0].token_ids == expected[:2]
    assert_pool_free(llm.engine)


def test_logprobs_match_hf(llm: LLM, llama: Path) -> None:
    prompt = random_prompts(1, llm.engine.model_config.vocab_size, 12, 12, seed=11)[0]
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=4),
    )[0]
    ref = hf_logprobs(llama, prompt + out.token_ids[:-1])
    assert out.logprobs is not None and len(out.logprobs) == 6
    for i, tok in enumerate(out.logprobs):
        row = ref[len(prompt) - 1 + i]
        # Tolerance: fp32 batched-vs-unbatched GEMMs differ in the last bits.
        assert tok.logprob == pytest.approx(row[tok.token_id].item(), abs=1e-4)
        assert [t for t, _ in tok.top_logprobs] == row.topk(4).indices.tolist()
        for t, lp in tok.top_logprobs:
            assert lp == pytest.approx(row[t].item(), abs=1e-4)
    chosen = [t.logprob for t in out.logprobs]
    assert None not in chosen
    assert out.cumulative_logprob == pytest.approx(sum(lp for lp in chosen if lp is not None))


def test_seeded_sampling_reproducible_across_batches(llm: LLM) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=7, max_tokens=12, ignore_eos=True)
    alone = llm.generate("Paris river", p)[0].token_ids
    noise = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    batched = llm.generate(["Paris river", "a b c", "more text here"], [p, noise, noise])[
        0
    ].token_ids
    assert alone == batched
    other = llm.generate(
        "Paris river", SamplingParams(temperature=1.0, seed=8, max_tokens=12, ignore_eos=True)
    )[0]
    assert other.token_ids != alone


def test_stop_strings_and_stop_ids(llm: LLM) -> None:
    base = llm.generate("the cache", greedy(30))[0]
    text = base.text
    stop = text[10:14]
    assert stop.strip(), "want a visible stop string"
    out = llm.generate("the cache", SamplingParams(temperature=0, max_tokens=30, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    stop_id = base.token_ids[4]
    out = llm.generate(
        "the cache", SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_id])
    )[0]
    assert out.token_ids == base.token_ids[: base.token_ids.index(stop_id) + 1]
    assert out.stop_reason == stop_id and out.finish_reason == "stop"
    assert_pool_free(llm.engine)


def test_streaming_deltas_add_up(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request(
        "s", "the model", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    )
    deltas, ids = [], []
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas.append(out.new_text)
            ids.extend(out.new_token_ids)
            final = out
    assert final is not None and final.finished
    assert "".join(deltas) == final.text and ids == final.token_ids


def test_reset_prefix_cache_makes_the_next_pass_cold(llm: LLM, llama: Path) -> None:
    prompt = {"prompt_token_ids": list(range(3, 70))}  # several full blocks
    first = llm.generate(prompt, greedy(5))[0].token_ids
    hits = llm.engine.stats().num_prefix_hit_blocks
    assert llm.generate(prompt, greedy(5))[0].token_ids == first
    assert llm.engine.stats().num_prefix_hit_blocks > hits  # the repeat hit the cache
    assert llm.reset_prefix_cache()
    hits = llm.engine.stats().num_prefix_hit_blocks
    assert llm.generate(prompt, greedy(5))[0].token_ids == first
    assert llm.engine.stats().num_prefix_hit_blocks == hits  # computed in full
    assert first == hf_greedy(llama, prompt["prompt_token_ids"], 5)
    assert_pool_free(llm.engine)


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ("", greedy(4), "prompt must not be empty"),
        ({"prompt_token_ids": []}, greedy(4), "prompt must not be empty"),
        ({"prompt_token_ids": [1, 10**9]}, greedy(4), "prompt_token_ids"),
        ({"prompt_token_ids": [5] * 3000}, greedy(4), "max_model_len"),
        (12345, greedy(4), "prompt"),
    ],
)
def test_bad_input_raises_and_engine_keeps_serving(
    llm: LLM, llama: Path, prompt, params, match
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        batch: Any = [prompt, "a good prompt"] if not isinstance(prompt, int) else [[prompt, "x"]]
        llm.generate(batch, params)
    assert_pool_free(llm.engine)
    ok = llm.generate("still serving", greedy(3))[0]
    assert ok.token_ids == hf_greedy(llama, llm.tokenizer.encode("still serving"), 3)


def test_cli_generate(llama: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdserve",
            "generate",
            "--model",
            str(llama),
            "--prompt",
            "the model",
            "--max-tokens",
            "5",
            "--ignore-eos",
            "--json",
            "--num-kv-blocks",
            "64",
            "--dtype",
            "float32",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(data["token_ids"]) == 5 and data["finish_reason"] == "length"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdserve",
            "generate",
            "--model",
            str(llama),
            "--prompt",
            "x",
            "--max-tokens",
            "0",
            "--num-kv-blocks",
            "64",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert bad.returncode == 2 and "max_tokens" in bad.stderr


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(ValueError, match=r"unsupported architecture.*GPT2LMHeadModel"):
        LLM(str(tmp_path))


def test_demo_model_is_built_once_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PDSERVE_CACHE", str(tmp_path))
    from engine.demo_model import demo_model_path

    path = demo_model_path()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert demo_model_path() == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    llm = LLM(None, num_kv_blocks=64)
    out = llm.generate("Hello", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_bf16_runs(llama: Path) -> None:
    llm = LLM(str(llama), dtype="bfloat16", num_kv_blocks=64)
    assert llm.engine.model.embed_tokens.weight.dtype == torch.bfloat16
    out = llm.generate("the model", greedy(4))[0]
    assert len(out.token_ids) == 4
